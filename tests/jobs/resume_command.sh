#!/usr/bin/env bash
# A stopped run is continued by the command its stop line prints, and nothing else is touched:
#   1. dp_train with non-default settings (--epochs, --lr, --seed, --out), stopped by Ctrl-C,
#      prints "continue with: mpirun -np 2 dp_train --resume <out>/checkpoint"; that command, run
#      as printed, continues the same run: its settings (no flag differs from the checkpoint's
#      run), its --out (the rank files there grow), "resumed from ... after step N", to the end
#      of the original --epochs;
#   2. a resume into a folder that holds another run is refused (exit 2) and leaves it as it was;
#   3. --resume given the run's folder instead of its checkpoint: "did you mean";
#   4. the finished run's last line names its folder and files, and its analysis command runs.
#   tests/jobs/resume_command.sh BIN_DIR
set -uo pipefail
bin=$(cd "$1" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
tmp=$(mktemp -d)
trap 'pkill -9 -f "$tmp/" 2>/dev/null; rm -rf "$tmp"' EXIT
# shellcheck source=../../scripts/lib.sh
source "$root/scripts/lib.sh"
gpt2p_test_data "$bin" "$tmp" || exit 1
flags=(--preset tiny --device cpu --max-train-pairs 64 --max-eval-pairs 16 --batch-size 16
       --seq-len 32 --data "$data" --log-every 1 --translate-samples 0 --save-every 1
       --epochs 3 --lr 0.0003 --seed 7)
set -m
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

# 1. Stop, then the printed command.
"$root/scripts/launch" mpirun --oversubscribe -np 2 "$bin/dp_train" "${flags[@]}" \
  --out "$tmp/a" >"$tmp/a.log" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q "step 2/" "$tmp/a.log" 2>/dev/null && break; sleep 0.1; done
kill -INT -- "-$pid"
wait "$pid"; rc=$?
cmd=$(sed -n 's/.*stopped by signal .* continue with: //p' "$tmp/a.log" | tail -1)
if [ "$rc" != 75 ] || [ -z "$cmd" ]; then
  bad "stop: exit $rc, stop line: '$cmd'"; tail -5 "$tmp/a.log"; exit 1
fi
ok "stop: exit 75, the stop line says: $cmd"
read -r -a words <<<"$cmd"
[ "${words[0]}" = mpirun ] && [ "${words[3]}" = "$bin/dp_train" ] && [ "${words[4]}" = --resume ] ||
  bad "the command is not 'mpirun -np N $bin/dp_train --resume DIR': $cmd"
size_before=$(stat -c %s "$tmp/a/rank0.h5")
# As printed, from another directory, with --oversubscribe for this 2-core machine.
(cd "$tmp" && mpirun --oversubscribe "${words[@]:1}") >"$tmp/a2.log" 2>&1
rc=$?
size_after=$(stat -c %s "$tmp/a/rank0.h5")
if [ "$rc" = 0 ] && grep -q "^resumed from $tmp/a/checkpoint after step [0-9]* .*writing to $tmp/a$" \
  "$tmp/a2.log" && grep -q "epoch 3/3 step 4/4" "$tmp/a2.log" &&
  ! grep -q "note: resuming with" "$tmp/a2.log" && [ "$size_after" -gt "$size_before" ] &&
  grep -q "^lr = 0.0003$" "$tmp/a/config.ini" && grep -q "^epochs = 3$" "$tmp/a/config.ini"; then
  ok "resume: the printed command continued the run in $tmp/a with its settings to epoch 3/3"
else
  bad "resume: exit $rc; rank0.h5 $size_before -> $size_after bytes; log:"; tail -8 "$tmp/a2.log"
fi
# The rank file holds both runs: a /segments table, a row per run (analysis/reader.py).
if "$(gpt2p_python)" - "$tmp/a/rank0.h5" <<'PY'; then
import sys, h5py
f = h5py.File(sys.argv[1], "r")
seg = f["segments"]
sys.exit(0 if len(seg[next(iter(seg))]) == 2 else 1)
PY
  ok "rank0.h5: the resumed run's rows follow the stopped run's (2 segments)"
else
  bad "rank0.h5: no second segment"
fi

# 4. The last line of the finished run: where the results are, and a command that reads them.
last=$(tail -1 "$tmp/a2.log")
plot_cmd=$(sed -n 's/^dp_train: finished after step [0-9]*; results in .*; plots and metrics: python3 \(.*\) (from the source tree: scripts\/python)$/\1/p' <<<"$last")
if [[ "$last" == "dp_train: finished after step "*"; results in $tmp/a: 2 timing files rank<r>.h5, config.ini"*"checkpoint/;"* ]] &&
  [ -n "$plot_cmd" ]; then
  read -r -a plot_words <<<"$plot_cmd"
  if "$(gpt2p_python)" "${plot_words[@]}" >"$tmp/plots.log" 2>&1 &&
    [ -s "$tmp/a/analysis/summary.json" ]; then
    ok "finished line: names $tmp/a and its files; its command wrote $tmp/a/analysis/summary.json"
  else
    bad "the finished line's command failed: $plot_cmd"; tail -4 "$tmp/plots.log"
  fi
else
  bad "the finished run's last line: $last"
fi

# 2. Another run's folder.
mpirun --oversubscribe -np 2 "$bin/dp_train" "${flags[@]}" --max-steps 2 --out "$tmp/b" \
  >"$tmp/b.log" 2>&1 || { bad "run b failed"; tail -5 "$tmp/b.log"; }
files_b() { find "$tmp/b" -type f ! -name run.lock -exec md5sum {} + | sort | md5sum; }
sum_b=$(files_b)
mpirun --oversubscribe -np 2 "$bin/dp_train" --resume "$tmp/a/checkpoint" --out "$tmp/b" \
  >"$tmp/into-b.log" 2>&1
rc=$?
if [ "$rc" = 2 ] && grep -q -- "--out $tmp/b holds another run" "$tmp/into-b.log" &&
  [ "$(files_b)" = "$sum_b" ]; then
  ok "into another run: refused with exit 2, $tmp/b unchanged"
else
  bad "into another run: exit $rc; log:"; tail -4 "$tmp/into-b.log"
fi

# 3. The run's folder for its checkpoint.
mpirun --oversubscribe -np 2 "$bin/dp_train" --resume "$tmp/a" --out "$tmp/c" --data "$data" \
  >"$tmp/folder.log" 2>&1
rc=$?
if [ "$rc" = 2 ] && grep -q -- "did you mean --resume $tmp/a/checkpoint?" "$tmp/folder.log"; then
  ok "run folder: exit 2, did you mean --resume $tmp/a/checkpoint"
else
  bad "run folder: exit $rc; log:"; tail -4 "$tmp/folder.log"
fi
exit "$fail"
