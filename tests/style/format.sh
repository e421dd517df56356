#!/usr/bin/env bash
# Every C++ and CUDA source the repository tracks is formatted as .clang-format says, by
# clang-format 14 (the version is pinned: another major version formats differently). Prints the
# files that differ and the command that fixes them, and exits 1 if there is one; exits 77
# (skipped) where clang-format 14 is not installed (scripts/setup installs it on Debian).
# usage: tests/style/format.sh [REPO_ROOT]        (default: two folders above this script)
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root" || exit 2

tool=
for candidate in clang-format-14 clang-format; do
  if command -v "$candidate" >/dev/null 2>&1 &&
     "$candidate" --version | grep -qE 'version 14\.'; then
    tool=$candidate; break
  fi
done
if [ -z "$tool" ]; then
  echo "format: clang-format 14 not found (apt-get install clang-format-14); skipped"
  exit 77
fi

mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
[ ${#files[@]} -gt 0 ] || { echo "format: no tracked sources (not a git checkout?)"; exit 2; }
bad=()
for f in "${files[@]}"; do
  "$tool" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  printf 'format: %s differs from .clang-format\n' "${bad[@]}"
  echo "format: fix with: $tool -i ${bad[*]}"
  exit 1
fi
echo "format: ${#files[@]} sources formatted as .clang-format says ($tool)"
