#!/usr/bin/env bash
# The project's CUDA kernels (src/kernels/*.cu, which include neither torch nor MPI) compile for
# sm_70 (V100, as on PSC Bridges-2), sm_80 and sm_90, with the flags CMakeLists.txt gives them and
# warnings as errors. CUDA 13 cannot target sm_70, so this uses a toolkit that can: $GPT2P_NVCC_SM70,
# or /usr/bin/nvcc when it is older than 13 (Debian 12's nvidia-cuda-toolkit 11.8, from non-free).
# Where neither is there and this runs as root on Debian, it installs that package (about 1.6 GB
# to download, 3 minutes); otherwise it says why and exits 77 (ctest: skipped).
#
#   tests/build/cuda_kernels_sm70.sh [SOURCE_DIR]
set -u
src=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
skip() { echo "cuda_kernels_sm70: skipped: $*"; exit 77; }

nvcc_release() {  # "11.8" from `nvcc --version`
  "$1" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p'
}
volta_capable() {  # nvcc older than 13
  local r
  r=$(nvcc_release "$1")
  [[ -n $r && ${r%%.*} -lt 13 ]]
}

nvcc=${GPT2P_NVCC_SM70:-/usr/bin/nvcc}
if ! volta_capable "$nvcc"; then
  if [[ -n ${GPT2P_NVCC_SM70:-} ]]; then
    skip "GPT2P_NVCC_SM70=$GPT2P_NVCC_SM70 is not an nvcc older than CUDA 13"
  fi
  [[ $(id -u) -eq 0 ]] || skip "no nvcc older than CUDA 13, and not root to install one"
  command -v apt-get > /dev/null || skip "no nvcc older than CUDA 13, and no apt-get to install one"
  grep -q bookworm /etc/os-release 2> /dev/null ||
    skip "no nvcc older than CUDA 13; the install here is written for Debian 12 (bookworm)"
  echo "cuda_kernels_sm70: installing Debian's nvidia-cuda-toolkit (nvcc 11.8) from non-free"
  list=/etc/apt/sources.list.d/gpt2p-nonfree.sources
  if [[ ! -f $list ]]; then
    printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' \
      'Suites: bookworm bookworm-updates' 'Components: contrib non-free' \
      'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' > "$list"
  fi
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
           --no-install-recommends nvidia-cuda-toolkit; } > /tmp/gpt2p-nvcc-install.log 2>&1; then
    tail -5 /tmp/gpt2p-nvcc-install.log
    skip "installing nvidia-cuda-toolkit failed (log: /tmp/gpt2p-nvcc-install.log)"
  fi
  volta_capable /usr/bin/nvcc || skip "the installed /usr/bin/nvcc is not older than CUDA 13"
  nvcc=/usr/bin/nvcc
fi

# Debian's nvcc finds ptxas and fatbinary on PATH: a CUDA 13 there (it cannot target sm_70) must
# not come first. Its host compiler must be one it supports: g++ <= 11, or clang 14.
export PATH="$(dirname "$(readlink -f "$nvcc")"):/usr/sbin:/usr/bin:/sbin:/bin"
host=()
if ! command -v g++-11 > /dev/null && command -v clang++-14 > /dev/null; then
  host=(-ccbin clang++-14)
fi
work=$(mktemp -d /tmp/gpt2p-sm70.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "cuda_kernels_sm70: $("$nvcc" --version | tail -2 | head -1), host ${host[1]:-default}"
fail=0
for cu in "$src"/src/kernels/*.cu; do
  name=$(basename "$cu" .cu)
  if ! "$nvcc" "${host[@]}" -std=c++17 -O3 -Xcompiler=-Wall,-Wextra -Werror=all-warnings \
      -I"$src/include" -gencode arch=compute_70,code=sm_70 -gencode arch=compute_80,code=sm_80 \
      -gencode arch=compute_90,code=sm_90 -c "$cu" -o "$work/$name.o" > "$work/$name.log" 2>&1; then
    echo "FAIL $name.cu:"
    cat "$work/$name.log"
    fail=1
    continue
  fi
  archs=$(cuobjdump --list-elf "$work/$name.o" 2> /dev/null | grep -o 'sm_[0-9]*' | sort -u |
          tr '\n' ' ')
  for want in sm_70 sm_80 sm_90; do
    if [[ " $archs" != *" $want "* ]]; then
      echo "FAIL $name.cu: no $want code in the object (found: $archs)"
      fail=1
    fi
  done
  echo "ok   $name.cu: $archs"
done
exit $fail
