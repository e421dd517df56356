# Shared by scripts/test, scripts/run, scripts/bench: configure + build in one place.
# Usage: source scripts/lib.sh; gpt2p_build <build-dir> [extra cmake args...]
GPT2P_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Paths under the repo hash relatively, so build dirs and clones share ccache hits.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$GPT2P_ROOT}
export GPT2P_VOCAB_DIR=${GPT2P_VOCAB_DIR:-$GPT2P_ROOT/.cache/gpt2-vocab}

# True when FILE is a dataset this prepare_data writes: it starts with the checksum block that
# DatasetFile::open checks (src/data/dataset_seal.cpp). An older one is made again.
gpt2p_dataset_ok() {
  [ "$(head -c 16 "$1" 2>/dev/null)" = "gpt2p-dataset 1 " ]
}

# The tests' dataset: sets $data to the cached one where it is current, or makes one in DIR with
# BIN/prepare_data. Prints "FAIL: prepare_data" and its log's tail and returns 1 when that fails.
#   gpt2p_test_data BIN DIR
gpt2p_test_data() {
  data=$GPT2P_ROOT/.cache/data/ding-gpt2.h5
  gpt2p_dataset_ok "$data" && return 0
  data=$2/ding-gpt2.h5
  "$1/prepare_data" --out "$data" >"$2/prepare_data.log" 2>&1 && return 0
  echo "FAIL: prepare_data"; tail "$2/prepare_data.log"; return 1
}

# The device scripts' dataset: sets $data, preparing it once with $1/prepare_data (log in $2).
gpt2p_device_data() {
  data=.cache/data/ding-gpt2.h5
  gpt2p_dataset_ok "$data" || "$1/prepare_data" --out "$data" >"$2/prepare_data.log" 2>&1
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

# Launching trainers so that a stop is never lost (scripts/launch, scripts/run, jobs/lib.sh).
#   gpt2p_launch mpirun -np N build/dp_train ... [--out DIR]
# Runs the launch line under setsid, without a controlling terminal, so a Ctrl-C at the terminal reaches this shell and
# not mpirun: Open MPI's mpirun answers a SIGINT/SIGTERM of its own by killing its ranks about a
# second later (odls_base_sigkill_timeout) and exits 1 whatever they returned. Here the first
# SIGINT/SIGTERM/SIGHUP/SIGUSR1 becomes SIGUSR1 to mpirun (which passes it on to the ranks of other nodes,
# where the build forwards it) and to the ranks of this host, which then finish their step, commit a
# checkpoint and exit 75. A third signal ends the job through mpirun at once (no checkpoint).
# Returns the launch's exit status; 75 also when mpirun exited otherwise but rank 0 wrote
# <out>/stopped.json during this launch (mpirun itself was signalled, e.g. by a scheduler, and
# odls_base_sigkill_timeout gave the ranks the time to commit).
gpt2p_launch() {
  local out stamp pid rc=0
  out=$(gpt2p_launch_out "$@")
  stamp=$(mktemp "${TMPDIR:-/tmp}/gpt2p-launch.XXXXXX") || return 1
  # Ranks read nothing from the terminal; without one they must not try.
  setsid "$@" </dev/null &
  pid=$!
  GPT2P_LAUNCH_SIGNALS=0
  # shellcheck disable=SC2064
  trap "gpt2p_launch_signal $pid" INT TERM HUP USR1
  # A trapped signal ends `wait` early: wait again until the launch itself has ended.
  wait "$pid" || rc=$?
  while kill -0 "$pid" 2>/dev/null; do rc=0; wait "$pid" || rc=$?; done
  trap - INT TERM HUP USR1
  if [ "$rc" != 0 ] && [ "$rc" != 75 ] && [ -n "$out" ] && [ "$out/stopped.json" -nt "$stamp" ]; then
    echo "launch: the ranks stopped cleanly and committed a checkpoint ($out/stopped.json), then" \
         "mpirun exited $rc: exit 75" >&2
    rc=75
  fi
  rm -f "$stamp"
  return "$rc"
}

# The --out of a trainer's launch line, or its default runs/<program>; empty when neither is there.
gpt2p_launch_out() {
  local a prev="" prog=""
  for a in "$@"; do
    case "$prev" in --out) echo "$a"; return 0 ;; esac
    case "$a" in
      --out=*) echo "${a#--out=}"; return 0 ;;
      */dp_train | dp_train | */pp_train | pp_train | */gpt2_train | gpt2_train) prog=${a##*/} ;;
    esac
    prev=$a
  done
  [ -n "$prog" ] && echo "runs/$prog"
  return 0
}

# One signal to a launch (gpt2p_launch): the first two become SIGUSR1 (a second is harmless: the
# trainers take it as the same request), the third SIGTERM to mpirun.
gpt2p_launch_signal() {
  GPT2P_LAUNCH_SIGNALS=$((GPT2P_LAUNCH_SIGNALS + 1))
  if [ "$GPT2P_LAUNCH_SIGNALS" -ge 3 ]; then
    echo "launch: third signal: ending the job now, without a checkpoint" >&2
    kill -TERM "$1" 2>/dev/null
    return 0
  fi
  [ "$GPT2P_LAUNCH_SIGNALS" = 1 ] &&
    echo "launch: stopping: the ranks finish their step, commit a checkpoint and exit 75" \
         "(a third Ctrl-C ends the job at once, without one)" >&2
  gpt2p_stop_ranks "$1"
}

# SIGUSR1 to the launcher process $1 and to the MPI ranks among its descendants (this host's): never
# to its other descendants, such as a log's tee, which a process substitution makes a child of
# mpirun and which SIGUSR1 would end.
gpt2p_stop_ranks() {
  local p queue=("$1")
  kill -USR1 "$1" 2>/dev/null
  while [ ${#queue[@]} -gt 0 ]; do
    p=${queue[0]}
    queue=("${queue[@]:1}")
    # A process without children makes pgrep fail: that must not end a caller under `set -e`
    # (a job script), from inside its signal trap.
    # shellcheck disable=SC2207
    queue+=($(pgrep -P "$p" || true))
    [ "$p" = "$1" ] && continue
    grep -qzE '^(OMPI_COMM_WORLD_RANK|PMI_RANK|PMIX_RANK)=' "/proc/$p/environ" 2>/dev/null &&
      kill -USR1 "$p" 2>/dev/null
  done
  return 0
}
