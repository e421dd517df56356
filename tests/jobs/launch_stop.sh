#!/usr/bin/env bash
# scripts/launch (and scripts/run and jobs/, which start trainers through the same gpt2p_launch)
# must end a stopped job in a committed checkpoint and exit 75:
#   1. Ctrl-C: SIGINT to the launch's process group, as a terminal sends it (dp_train);
#   2. SIGTERM to mpirun itself, which then exits 1: 75 all the same, from <out>/stopped.json
#      (pp_train; Open MPI's odls_base_sigkill_timeout gives the ranks the time to commit);
#   3. a stopped.json left by an earlier run does not turn another failure into 75;
#   4. Ctrl-C during an epoch's evaluation (the whole validation split: some seconds on CPU) ends
#      the evaluation at its next batch: exit 75, the checkpoint at the next epoch's start, and no
#      validation figure printed for that epoch.
#   tests/jobs/launch_stop.sh BIN_DIR
set -uo pipefail
# shellcheck source=../../scripts/lib.sh
source "$(dirname "$0")/../../scripts/lib.sh"
# shellcheck disable=SC2016  # $tmp expands when the exit trap runs
gpt2p_job_test_start "$1" 'pkill -9 -f "$tmp/" 2>/dev/null' || exit 1
flags=(--preset tiny --device cpu --max-train-pairs 128 --max-eval-pairs 32 --batch-size 16
       --seq-len 32 --data "$data" --epochs 1000 --log-every 1 --save-every -1
       --translate-samples 0)
# Job control: each background job leads a process group of its own and keeps SIGINT's default
# action, as a terminal's foreground job does.
set -m
fail=0

# start NAME PROG: scripts/launch mpirun -np 2 PROG ... --out $tmp/NAME/out, in the background;
# returns once step 2 is logged.
start() {
  mkdir -p "$tmp/$1"
  "$root/scripts/launch" mpirun --oversubscribe -np 2 "$bin/$2" "${flags[@]}" \
    --out "$tmp/$1/out" >"$tmp/$1/log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do grep -q "step 2/" "$tmp/$1/log" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}

# check NAME RC: exit 75, the stop line, stopped.json and a committed checkpoint.
check() {
  local parts
  parts=$(find "$tmp/$1/out/checkpoint" -name meta.json 2>/dev/null | wc -l)
  if [ "$2" = 75 ] && grep -q "stopped by signal .*--resume" "$tmp/$1/log" &&
    [ -s "$tmp/$1/out/stopped.json" ] && [ "$parts" -ge 1 ] &&
    [ -z "$(find "$tmp/$1/out" -name '*.tmp.*' -o -name '*.old.*' -o -name '*.next')" ]; then
    echo "ok: $1: exit 75, checkpoint ($parts part(s)), stopped.json, stop line, nothing left"
  else
    echo "FAIL: $1: exit $2 (checkpoint parts: $parts); log:"; tail -8 "$tmp/$1/log"; fail=1
  fi
}

# 1. Ctrl-C
if start ctrl-c dp_train; then
  kill -INT -- "-$pid"
  wait "$pid"; check ctrl-c $?
else
  echo "FAIL: ctrl-c: no step 2 logged"; tail -5 "$tmp/ctrl-c/log"; fail=1
fi

# 2. SIGTERM to mpirun itself
export OMPI_MCA_odls_base_sigkill_timeout=5
if start mpirun-term pp_train; then
  kill -TERM "$(pgrep -x -P "$pid" mpirun || pgrep -x -P "$pid" orterun)"
  wait "$pid"; rc=$?
  check mpirun-term "$rc"
  grep -q "then mpirun exited" "$tmp/mpirun-term/log" ||
    { echo "FAIL: mpirun-term: no line saying that mpirun's own exit became 75"; fail=1; }
else
  echo "FAIL: mpirun-term: no step 2 logged"; tail -5 "$tmp/mpirun-term/log"; fail=1
fi
unset OMPI_MCA_odls_base_sigkill_timeout

# 3. An old stopped.json, then a launch that fails at start (a bad flag: exit 2).
"$root/scripts/launch" mpirun --oversubscribe -np 2 "$bin/dp_train" "${flags[@]}" \
  --out "$tmp/ctrl-c/out" --resume "$tmp/ctrl-c/out/checkpoint" --lr nonsense \
  >"$tmp/stale.log" 2>&1
rc=$?
if [ "$rc" = 2 ]; then
  echo "ok: stale: a failed launch beside an earlier stopped.json exits 2"
else
  echo "FAIL: stale: exit $rc, expected 2"; tail -5 "$tmp/stale.log"; fail=1
fi
# 4. Ctrl-C during evaluation
mkdir -p "$tmp/eval"
"$root/scripts/launch" mpirun --oversubscribe -np 2 "$bin/dp_train" --preset tiny --device cpu \
  --max-train-pairs 64 --batch-size 16 --seq-len 32 --data "$data" --epochs 3 --log-every 1 \
  --translate-samples 0 --max-eval-pairs 0 --out "$tmp/eval/out" >"$tmp/eval/log" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q "Epoch 0 on Rank 0" "$tmp/eval/log" && break; sleep 0.1; done
sleep 0.5
kill -INT -- "-$pid"
wait "$pid"; rc=$?
meta=$tmp/eval/out/checkpoint/meta.json
if [ "$rc" = 75 ] && ! grep -q "epoch 1: validation loss" "$tmp/eval/log" &&
  grep -q '"epoch": 1' "$meta" 2>/dev/null && grep -q '"batch_in_epoch": 0' "$meta"; then
  echo "ok: eval: a stop during evaluation ended it: exit 75, checkpoint at epoch 1 batch 0"
else
  echo "FAIL: eval: exit $rc; log:"; tail -6 "$tmp/eval/log"; grep -h '"epoch\|batch_in' "$meta"
  fail=1
fi
exit "$fail"
