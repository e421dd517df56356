#!/usr/bin/env bash
# gpt2_generate uses what the trainers wrote, and gives what the trainers' own decoding gives:
#   1. dp_train's checkpoint: --translate of a test pair's German prints the translation the
#      trainer printed for it at the end of its run, given the trainer's budget of tokens (from
#      the reference's length; without it, the trainer's text is the start of ours);
#      --translate - turns stdin into as many lines (a blank line stays blank); --json says what
#      stopped each;
#   2. pp_train's checkpoint root: its stages are joined into one model, whose loss (gpt2_eval
#      --data) is the validation loss the run printed, and which translates;
#   3. --prompt samples: the same seed gives the same text, another seed another.
#   tests/jobs/generate_command.sh BIN_DIR
set -uo pipefail
# shellcheck source=../../scripts/lib.sh
source "$(dirname "$0")/../../scripts/lib.sh"
gpt2p_job_test_start "$1" || exit 1
flags=(--preset tiny --device cpu --max-train-pairs 64 --max-eval-pairs 16 --batch-size 16
       --seq-len 32 --data "$data" --epochs 1)
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
gen() { "$bin/gpt2_generate" "$@"; }

# 1. Data parallel.
mpirun --oversubscribe -np 2 "$bin/dp_train" "${flags[@]}" --translate-samples 2 \
  --out "$tmp/dp" >"$tmp/dp.log" 2>&1 || { bad "dp_train failed"; tail -5 "$tmp/dp.log"; exit 1; }
mapfile -t de < <(sed -n 's/^  de: //p' "$tmp/dp.log")
mapfile -t en < <(sed -n 's/^  en: //p' "$tmp/dp.log")
mapfile -t hyp < <(sed -n 's/^  model: //p' "$tmp/dp.log")
[ "${#de[@]}" = 2 ] && [ "${#hyp[@]}" = 2 ] || { bad "the trainer printed no translations"; exit 1; }
# The trainer's budget: the reference's tokens n, then n + n/2 + 8 generated at most.
budget() {
  "$(gpt2p_python)" -c 'import json, sys; print(json.dumps({"text": sys.argv[1]}))' "$1" |
    "$bin/tokenize" | "$(gpt2p_python)" -c '
import json, sys
n = len(json.loads(sys.stdin.readline())["ids"])
print(n + n // 2 + 8)'
}
for i in 0 1; do
  n=$(budget "${en[$i]}")
  out=$(gen --checkpoint "$tmp/dp/checkpoint" --translate "${de[$i]}" --max-new-tokens "$n" \
    2>"$tmp/gen.err")
  rc=$?
  longer=$(gen --checkpoint "$tmp/dp/checkpoint" --translate "${de[$i]}" 2>/dev/null)
  if [ "$rc" = 0 ] && [ -n "${hyp[$i]}" ] && [ "$out" = "${hyp[$i]}" ] &&
    [[ "$longer" == "${hyp[$i]}"* ]]; then
    ok "dp: '${de[$i]}' -> the trainer's '${hyp[$i]}' (with its budget of $n tokens)"
  else
    bad "dp: exit $rc, '${de[$i]}' -> '$out' ($n tokens), the trainer printed '${hyp[$i]}'"
    cat "$tmp/gen.err"
  fi
done
printf '%s\n\n%s\n' "${de[0]}" "${de[1]}" |
  gen --checkpoint "$tmp/dp/checkpoint" --translate - >"$tmp/lines.txt" 2>"$tmp/gen.err"
rc=$?
mapfile -t lines <"$tmp/lines.txt"
first=$(gen --checkpoint "$tmp/dp/checkpoint" --translate "${de[0]}" 2>/dev/null)
if [ "$rc" = 0 ] && [ "${#lines[@]}" = 3 ] && [ "${lines[0]}" = "$first" ] &&
  [ -z "${lines[1]}" ] && [[ "${lines[2]}" == "${hyp[1]}"* ]]; then
  ok "dp: --translate - gave 3 lines for 3 (the blank one blank)"
else
  bad "dp: --translate - exit $rc, ${#lines[@]} lines:"; cat "$tmp/lines.txt" "$tmp/gen.err"
fi
if printf '%s\n' "${de[0]}" | gen --checkpoint "$tmp/dp/checkpoint" --translate - --json \
  2>/dev/null | "$(gpt2p_python)" -c '
import json, sys
j = json.loads(sys.stdin.readline())
sys.exit(0 if j["source"] and j["stopped_by"] in ("end", "max-new-tokens", "max-len") else 1)'; then
  ok "dp: --json gives a JSON object a line"
else
  bad "dp: --json"
fi

# 2. Pipeline: the stages of the checkpoint root, joined.
mpirun --oversubscribe -np 2 "$bin/pp_train" "${flags[@]}" --out "$tmp/pp" >"$tmp/pp.log" 2>&1 ||
  { bad "pp_train failed"; tail -5 "$tmp/pp.log"; exit 1; }
printed=$(sed -n 's/^epoch 1: validation loss \([0-9.]*\) .*/\1/p' "$tmp/pp.log")
"$bin/gpt2_eval" --checkpoint "$tmp/pp/checkpoint" --data "$data" --max-examples 16 --max-len 32 \
  --batch-size 16 >"$tmp/eval.json" 2>"$tmp/eval.err"
rc=$?
if [ "$rc" = 0 ] && [ -n "$printed" ] && "$(gpt2p_python)" - "$tmp/eval.json" "$printed" <<'PY'; then
import json, sys
loss = json.load(open(sys.argv[1]))["loss"]
sys.exit(0 if abs(loss - float(sys.argv[2])) <= 6e-5 else 1)
PY
  ok "pp: the joined stages' validation loss is the run's ($printed)"
else
  bad "pp: gpt2_eval exit $rc, run printed '$printed':"; cat "$tmp/eval.json" "$tmp/eval.err"
fi
out=$(gen --checkpoint "$tmp/pp/checkpoint" --translate "${de[0]}" 2>"$tmp/gen.err")
rc=$?
[ "$rc" = 0 ] && [ -n "$out" ] && ok "pp: the joined model translates: '$out'" ||
  { bad "pp: gpt2_generate exit $rc"; cat "$tmp/gen.err"; }

# 3. Sampling.
s1=$(gen --checkpoint "$tmp/dp/checkpoint" --prompt "The weather" --seed 3 --max-new-tokens 12)
s2=$(gen --checkpoint "$tmp/dp/checkpoint" --prompt "The weather" --seed 3 --max-new-tokens 12)
s3=$(gen --checkpoint "$tmp/dp/checkpoint" --prompt "The weather" --seed 4 --max-new-tokens 12)
if [[ "$s1" == "The weather"?* ]] && [ "$s1" = "$s2" ] && [ "$s1" != "$s3" ]; then
  ok "prompt: seed 3 twice: '$s1'; seed 4: '$s3'"
else
  bad "prompt: '$s1' / '$s2' / '$s3'"
fi
exit "$fail"
