#!/bin/bash
# Builds gpt2-parallel once on PSC Bridges-2, before any GPU job, so that GPU hours are not spent
# compiling. Run it from the repository root on a login node, or as a CPU job:
#   bash jobs/bridges2_setup.sh
#   sbatch -A <allocation> jobs/bridges2_setup.sh
# It loads the modules, makes the Python venv that holds PyTorch (whose libtorch the build links)
# and the analysis packages, fetches the GPT-2 vocabulary, and builds the programs into $BIN.
# Run again after a `git pull`: the build is then incremental. What the cluster must provide
# (modules or your own installs, found through CMAKE_PREFIX_PATH / DEPS_PREFIX):
#   a C++17 compiler and CMake >= 3.22; Open MPI; a CUDA 12 (or 11.8) toolkit, since CUDA 13 cannot
#   build for the V100's sm_70; HDF5 with its C++ library; Boost.ProgramOptions; PCRE2 (8-bit);
#   nlohmann-json (headers). PyTorch for CUDA 12 comes from pip into $VENV.
#SBATCH --job-name=gpt2p-setup
#SBATCH --partition=RM-shared
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=8
#SBATCH --time=01:00:00
#SBATCH --output=results/slurm-%x-%j.out

# ---- edit for your cluster ------------------------------------------------------------------
MODULES=${MODULES-"cuda openmpi/4.0.5-gcc10.2.0 anaconda3"}  # check `module avail`; add HDF5,
# Boost and PCRE2 modules where Bridges-2 has them, else install them and set DEPS_PREFIX
VENV=${VENV-$HOME/venvs/gpt2p}  # made when missing; empty: use the python3 and libtorch found as is
TORCH_PIP=${TORCH_PIP:-"torch --index-url https://download.pytorch.org/whl/cu124"}  # with sm_70
DEPS_PREFIX=${DEPS_PREFIX:-}   # extra install prefixes for CMake, ';'-separated (Boost, PCRE2, ...)
BIN=${BIN:-build-release}      # the build directory the GPU jobs use
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-7.0}  # the GPUs to build for: V100 (sm_70)
# ----------------------------------------------------------------------------------------------
set -euo pipefail
[ "${1:-}" = --dry-run ] && { DRY_RUN=1; shift; }
source "${GPT2P_ROOT:-${SLURM_SUBMIT_DIR:-$(pwd)}}/jobs/lib.sh"
VENV_MADE_HERE=$VENV VENV=  # job_environment would activate $VENV: this script makes it first
job_environment
VENV=$VENV_MADE_HERE
job_show
run() { echo "setup: $*"; [ "$DRY_RUN" = 1 ] || "$@"; }

if [ -n "$VENV" ]; then
  if [ ! -x "$VENV/bin/python" ]; then
    run python3 -m venv "$VENV"
    # shellcheck disable=SC2086
    run "$VENV/bin/pip" install $TORCH_PIP h5py numpy matplotlib
  fi
  [ "$DRY_RUN" = 1 ] || source "$VENV/bin/activate"
fi
prefix=$DEPS_PREFIX
if [ "$DRY_RUN" != 1 ] && python3 -c 'import torch' 2> /dev/null; then
  torch_cuda=$(python3 -c 'import torch; print(torch.version.cuda or "")')
  if [ -z "$torch_cuda" ]; then
    echo "setup: PyTorch here has no CUDA: the build will be CPU-only"
  else
    echo "setup: PyTorch $(python3 -c 'import torch; print(torch.__version__)') for CUDA $torch_cuda"
    # A V100 needs sm_70 code in libtorch (CUDA 13 builds have none).
    python3 -c 'import sys, torch; sys.exit("sm_70" not in torch.cuda.get_arch_list())' ||
      echo "setup: warning: this PyTorch has no sm_70 (V100) code:" \
           "$(python3 -c 'import torch; print(torch.cuda.get_arch_list())'): set TORCH_PIP" \
           "to a cu12x build" >&2
  fi
  prefix="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')${prefix:+;$prefix}"
fi

# The GPT-2 vocabulary: Hugging Face's vocab.json + merges.txt (a login node reaches the internet).
vocab=.cache/gpt2-vocab
if [ ! -s "$vocab/encoder.json" ] && [ ! -s "$vocab/vocab.json" ]; then
  hf=https://huggingface.co/openai-community/gpt2/resolve/main
  run mkdir -p "$vocab.tmp"
  run curl -fsSL -o "$vocab.tmp/vocab.json" "$hf/vocab.json"
  run curl -fsSL -o "$vocab.tmp/merges.txt" "$hf/merges.txt"
  run mv "$vocab.tmp" "$vocab"
fi
echo "setup: GPT-2 vocabulary in $vocab"

if [ -x "$BIN/dp_train" ] && [ -x "$BIN/pp_train" ] && [ -x "$BIN/prepare_data" ] &&
   [ "${REBUILD:-0}" != 1 ]; then
  echo "setup: $BIN has the programs (REBUILD=1 rebuilds after a git pull)"
  exit 0
fi
export GPT2P_BUILD_TYPE=${GPT2P_BUILD_TYPE:-Release} GPT2P_JOBS=${SLURM_CPUS_PER_TASK:-4}
run gpt2p_build "$BIN" -DGPT2P_BUILD_TESTS=OFF ${prefix:+"-DCMAKE_PREFIX_PATH=$prefix"}
[ "$DRY_RUN" = 1 ] || grep -h "gpt2p: C" "$BIN.configure.log" || true
echo "setup: done: next, sbatch jobs/bridges2_data.sbatch (the dataset), then the GPU jobs"
