#!/usr/bin/env bash
# The libraries form a stack (README.md, Layout; CMakeLists.txt): each folder of include/gpt2p/
# and src/ is one library and may include only its own headers and those of the folders before
# it in the order below. The torch-free layers include nothing of torch (torch/, ATen/, c10/),
# so the tools built on them build without libtorch. The command line stays at the edge: no header
# but cli/'s own and parallel/train/flags.h (the trainers' flags) includes cli/options.h or
# Boost.ProgramOptions, so the mechanisms take plain option values. The test prints every include
# that breaks a rule as file:line: text and exits 1 if there is one (0 if none).
# usage: tests/style/layers.sh [REPO_ROOT]        (default: two folders above this script)
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root" || exit 2

order=(core io cli data pipeline/plan compat comm kernels model pipeline/runtime pipeline/perf
       parallel/data_parallel parallel/train parallel/trainers)
torch_free=" core io cli data pipeline/plan "

bad=0
for i in "${!order[@]}"; do
  layer=${order[$i]}
  allowed=" ${order[*]:0:$((i + 1))} "
  files=$(find "include/gpt2p/$layer" "src/$layer" -maxdepth 1 -type f \
            \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null)
  [ -n "$files" ] || { echo "layers: no files for layer '$layer' (update the order above)"; exit 2; }
  while IFS= read -r hit; do
    [ -n "$hit" ] || continue
    inc=$(sed -E 's/.*#include "gpt2p\/([^"]+)\/[^/"]+".*/\1/' <<<"${hit#*:*:}")
    if [[ "$allowed" != *" $inc "* ]]; then
      echo "$hit   <- $layer may include only: ${allowed# }"; bad=1
    fi
  done < <(grep -nH '#include "gpt2p/' $files | grep -v '"gpt2p/build_info.h"')
  if [[ "$torch_free" == *" $layer "* ]]; then
    while IFS= read -r hit; do
      [ -n "$hit" ] && { echo "$hit   <- $layer is torch-free"; bad=1; }
    done < <(grep -nHE '#include <(torch|ATen|c10)/' $files)
  fi
done
while IFS= read -r hit; do
  [ -n "$hit" ] && { echo "$hit   <- only cli/ and parallel/train/flags.h parse the command line"; bad=1; }
done < <(grep -rnHE '#include ("gpt2p/cli/options.h"|<boost/program_options)' include/gpt2p |
           grep -vE '^include/gpt2p/(cli/|parallel/train/flags\.h:)')
[ $bad = 0 ] && echo "layers: every include goes down the stack (${#order[@]} layers)"
exit $bad
