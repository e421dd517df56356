#!/usr/bin/env bash
# shellcheck disable=SC2317  # the checks are functions that check() and expect() run
# A build error on the first run: scripts/run must say what it builds, and when the compiler fails
# print the compiler's message and the log's path, and exit non-zero (not exit 1 with nothing said).
# Runs on a copy of the working tree (tracked and new files, not the build folders), with an
# `#error` appended to src/core/error.cpp and only the torch-free gpt2p_core library as the target
# (GPT2P_TARGETS), built in a fresh folder (GPT2P_BIN): the failure comes within seconds.
# Exit 77 (skipped) where the copy cannot be made or scripts/setup has not run here.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
git -C "$root" rev-parse --git-dir >/dev/null 2>&1 || { echo "SKIP: $root is not a git checkout"; exit 77; }
[ -s "$root/.cache/gpt2-vocab/encoder.json" ] ||
  { echo "SKIP: no GPT-2 vocabulary in $root/.cache/gpt2-vocab (run scripts/setup)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
src=$tmp/src
mkdir -p "$src/.cache"
(cd "$root" && git ls-files -z --cached --others --exclude-standard |
   tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -C "$src" -xf -
# What scripts/setup looks for and the copy lacks (ignored by git): the vocabulary, and on a GPU
# machine the unpacked dependencies.
ln -s "$root/.cache/gpt2-vocab" "$src/.cache/gpt2-vocab"
[ ! -d "$root/.gpu-deps" ] || ln -s "$root/.gpu-deps" "$src/.gpu-deps"
# scripts/run starts with scripts/setup: here it must be a quiet no-op.
t0=$SECONDS
if ! (cd "$src" && GPT2P_SETUP_QUIET=1 scripts/setup) >"$tmp/setup.log" 2>&1; then
  echo "SKIP: scripts/setup fails here:"; sed 's/^/  /' "$tmp/setup.log"; exit 77
fi
echo "scripts/setup: $((SECONDS - t0)) s, $(wc -c <"$tmp/setup.log") bytes of output"

fail=0
check() {  # check NAME COMMAND...: runs it, prints PASS/FAIL
  if "${@:2}"; then echo "PASS: $1"; else echo "FAIL: $1"; fail=1; fi
}
printf '#error injected by the build_error test\n' >>"$src/src/core/error.cpp"
t0=$SECONDS
rc=0
(cd "$src" && GPT2P_BIN="$tmp/build" GPT2P_TARGETS=gpt2p_core GPT2P_JOBS=2 timeout 240 scripts/run) \
  >"$tmp/stdout" 2>"$tmp/stderr" </dev/null || rc=$?
echo "scripts/run: exit $rc after $((SECONDS - t0)) s"
cat "$tmp/stdout" "$tmp/stderr" >"$tmp/all"
show() { echo "  scripts/run's output:"; sed 's/^/    /' "$tmp/all"; }
expect() {  # expect COMMAND...: runs it; when it fails, shows scripts/run's output
  "$@" && return 0
  show; return 1
}

exits_non_zero() { [ "$rc" != 0 ] && [ "$rc" != 124 ]; }
says_what_it_builds() {
  grep -q "^build: first build of gpt2p_core in $tmp/build: [0-9]* steps, about .* on [0-9]* cores" "$tmp/all"
}
prints_the_compiler_error() {
  grep -q "src/core/error.cpp:[0-9]*:[0-9]*: error: #error injected by the build_error test" "$tmp/all"
}
prints_the_log() {
  grep -q "whole output is in $tmp/build/build.log" "$tmp/all" &&
    grep -q "injected by the build_error test" "$tmp/build/build.log"
}
runs_nothing_after() { ! grep -q "== dp_train" "$tmp/all"; }
check "scripts/run exits non-zero when the build fails" expect exits_non_zero
check "it says what it builds and about how long that takes" expect says_what_it_builds
check "it prints the compiler's error" expect prints_the_compiler_error
check "it names the build log, which holds the whole output" expect prints_the_log
check "it runs no trainer after a failed build" expect runs_nothing_after
exit "$fail"
