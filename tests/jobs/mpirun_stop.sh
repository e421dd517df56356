#!/usr/bin/env bash
# An mpirun job script stopped as Slurm stops it (sbatch --signal=B:TERM: SIGTERM to the batch
# shell) must end with 75, a committed checkpoint and the "stopped by signal" line in its log,
# whether or not this Open MPI passes SIGUSR1 on: job_launch (jobs/lib.sh) signals the ranks too,
# and the log's tee, a child of mpirun as the ranks are, must survive it.
#   tests/jobs/mpirun_stop.sh BIN_DIR
set -uo pipefail
# shellcheck source=../../scripts/lib.sh
source "$(dirname "$0")/../../scripts/lib.sh"
gpt2p_job_test_start "$1" 'pkill -9 -P $$ 2>/dev/null' || exit 1
fail=0
for prog in pp_train dp_train; do
  mkdir -p "$tmp/$prog"
  # Under `set -euo pipefail`, as the job scripts run: the signal trap must not end the shell.
  bash -c 'set -euo pipefail; RESULTS=$2 DRY_RUN=0 LAUNCHER=mpirun; trap "echo \$? >$RESULTS/rc" EXIT
           source "$1/jobs/lib.sh" >/dev/null; shift 2; job_launch "$@" >/dev/null' _ "$root" "$tmp/$prog" \
    mpirun --oversubscribe -np 2 "$bin/$prog" --preset tiny --device cpu --max-train-pairs 128 \
    --max-eval-pairs 32 --batch-size 16 --seq-len 32 --data "$data" --out "$tmp/$prog/out" \
    --epochs 1000 --log-every 1 --save-every -1 --translate-samples 0 &
  shell=$!
  for _ in $(seq 600); do grep -q "step 2/" "$tmp/$prog/job.log" 2>/dev/null && break; sleep 0.1; done
  kill -TERM "$shell"
  for _ in $(seq 600); do [ -s "$tmp/$prog/rc" ] && break; sleep 0.1; done
  rc=$(cat "$tmp/$prog/rc" 2>/dev/null || echo "none (still running 60 s after SIGTERM)")
  if [ "$rc" = 75 ] && grep -q "stopped by signal SIGUSR1.*--resume" "$tmp/$prog/job.log" &&
    [ -n "$(find "$tmp/$prog/out/checkpoint" -name meta.json 2>/dev/null)" ]; then
    echo "ok: $prog under job_launch: SIGTERM of the shell -> exit 75, checkpoint, stop line"
  else
    echo "FAIL: $prog under job_launch: exit $rc; log:"; tail -5 "$tmp/$prog/job.log"; fail=1
  fi
done
exit "$fail"
