# Shared by scripts/test, scripts/run, scripts/bench: configure + build in one place.
# Usage: source scripts/lib.sh; gpt2p_build <build-dir> [extra cmake args...]
GPT2P_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Paths under the repo hash relatively, so build dirs and clones share ccache hits.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$GPT2P_ROOT}
export GPT2P_VOCAB_DIR=${GPT2P_VOCAB_DIR:-$GPT2P_ROOT/.cache/gpt2-vocab}

# The device scripts' dataset: sets $data, preparing it once with $1/prepare_data (log in $2).
gpt2p_device_data() {
  data=.cache/data/ding-gpt2.h5
  [ -s "$data" ] || "$1/prepare_data" --out "$data" >"$2/prepare_data.log" 2>&1
}

# True when PyTorch with CUDA and a GPU are here: then we build against PyTorch's libtorch.
gpt2p_has_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 &&
    python3 -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null
}

gpt2p_build() {
  local dir=$1; shift
  local args=(-G Ninja -DCMAKE_BUILD_TYPE=${GPT2P_BUILD_TYPE:-RelWithDebInfo})
  if gpt2p_has_gpu; then
    [ -d "$GPT2P_ROOT/.gpu-deps" ] && eval "$(bash "$GPT2P_ROOT/.gpu-deps/unpack")"
    args+=(-DCMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:-$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')}"
           -DBoost_USE_STATIC_LIBS=ON)
  fi
  command -v ninja >/dev/null 2>&1 || args=("${args[@]:2}")
  cmake -S "$GPT2P_ROOT" -B "$dir" "${args[@]}" "$@" >"$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log"; echo "configure failed (log: $dir.configure.log)" >&2; return 1; }
  # GPT2P_TARGETS="a b": build only those (scripts/run needs no test binaries).
  # shellcheck disable=SC2086
  cmake --build "$dir" -j "${GPT2P_JOBS:-$(nproc)}" ${GPT2P_TARGETS:+--target $GPT2P_TARGETS}
}

# The python3 that has the analysis dependencies (h5py, numpy, matplotlib, pytest): the first on
# PATH may be a pyenv/venv one without them, while Debian's python3-* packages live in
# $GPT2P_SYSTEM_PYTHON (/usr/bin/python3). Looks at what is installed when it is called, so call it
# after scripts/setup: a fresh machine gets those packages only then.
#   gpt2p_python [module...]   prints the interpreter that has the modules (default: h5py numpy
#                              matplotlib); non-zero, with a hint on stderr, when none has them
gpt2p_python() {
  local mods=("$@") py path
  [ ${#mods[@]} -gt 0 ] || mods=(h5py numpy matplotlib)
  for py in python3 "${GPT2P_SYSTEM_PYTHON:-/usr/bin/python3}"; do
    path=$(command -v "$py" 2>/dev/null) || continue
    # find_spec locates a module without importing it: a few milliseconds per interpreter.
    if "$path" -c 'import importlib.util as u, sys
sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))' "${mods[@]}" 2>/dev/null; then
      echo "$path"; return 0
    fi
  done
  echo "gpt2p: neither python3 on PATH nor ${GPT2P_SYSTEM_PYTHON:-/usr/bin/python3} has ${mods[*]};" \
       "scripts/setup installs them (Debian: python3-h5py python3-numpy python3-matplotlib" \
       "python3-pytest), or set GPT2P_PYTHON" >&2
  command -v python3 2>/dev/null || echo python3
  return 1
}
# What the scripts run Python with. Nothing is probed here (this file is sourced before
# scripts/setup has installed anything): scripts/python picks the interpreter each time it runs.
# Set GPT2P_PYTHON to use a particular one.
export GPT2P_PYTHON=${GPT2P_PYTHON:-$GPT2P_ROOT/scripts/python}
