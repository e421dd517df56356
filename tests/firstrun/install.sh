#!/usr/bin/env bash
# `cmake --install BUILD --prefix DIR` gives programs that run by name from DIR/bin, away from the
# build folder: every program is there, finds its libraries (libtorch included), and answers
# --help; the torch-free tokenize round-trips a sentence with the project's vocabulary.
#   tests/firstrun/install.sh BUILD_DIR
set -uo pipefail
build=$(cd "$1" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1; then
  echo "FAIL: cmake --install"; tail -5 "$tmp/install.log"; exit 1
fi
fail=0
export PATH="$tmp/prefix/bin:$PATH"
cd "$tmp"  # away from the build folder and the repository
for p in comm_bench gpt2_train gpt2_eval gpt2_generate dp_train pp_train pp_plan tokenize prepare_data; do
  if [ ! -x "$tmp/prefix/bin/$p" ]; then echo "FAIL: $p not installed"; fail=1; continue; fi
  if ldd "$tmp/prefix/bin/$p" | grep -q "not found"; then
    echo "FAIL: $p: $(ldd "$tmp/prefix/bin/$p" | grep 'not found' | head -2)"; fail=1; continue
  fi
  if ! "$p" --help >"$tmp/help.txt" 2>&1 || ! grep -q "usage: $p" "$tmp/help.txt"; then
    echo "FAIL: $p --help"; head -3 "$tmp/help.txt"; fail=1; continue
  fi
done
vocab=${GPT2P_VOCAB_DIR:-$root/.cache/gpt2-vocab}
if [ -f "$vocab/encoder.json" ] || [ -f "$vocab/vocab.json" ]; then
  ids=$(echo '{"text": "Hallo Welt"}' | tokenize --vocab-dir "$vocab")
  text=$(echo "$ids" | tokenize --vocab-dir "$vocab" --decode)
  if [ "$text" = '{"text":"Hallo Welt"}' ]; then
    echo "ok: tokenize by name: $ids"
  else
    echo "FAIL: tokenize round trip: '$ids' -> '$text'"; fail=1
  fi
fi
[ "$fail" = 0 ] && echo "ok: every program installed in $tmp/prefix/bin runs by name"
exit "$fail"
