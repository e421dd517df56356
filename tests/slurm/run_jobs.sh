#!/usr/bin/env bash
# The Slurm job scripts, for real, on a one-node cluster (scripts/slurm-cluster) with CPU ranks:
#   1. jobs/slurm_dp_train.sbatch and jobs/slurm_pp_train.sbatch under `sbatch --wait`: exit 0,
#      rank0.h5 and rank1.h5 written;
#   2. pre-emption: a long dp_train job, `scancel --signal=TERM` once it trains, must end with exit
#      75, a committed checkpoint and a line saying where it is and how to resume ("stopped by
#      signal", "--resume"); a second job with --resume <that checkpoint> continues from its step;
#   3. the PSC Bridges-2 set (jobs/bridges2_setup.sh, bridges2_data.sbatch, bridges2_dp_train and
#      bridges2_pp_train.sbatch) end to end, with its site lines overridden for this cluster.
# Usage: tests/slurm/run_jobs.sh [BUILD_DIR]   (default build/; needs dp_train, pp_train)
# Exit 77 (skipped) only where Slurm is missing and cannot be installed (not root, no apt-get).
# The cluster is left running when it ran before; a cluster this test started is stopped.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(cd "${1:-$root/build}" && pwd)
cd "$root"
for p in dp_train pp_train; do
  [ -x "$bin/$p" ] || { echo "FAIL: $bin/$p is missing: build it first"; exit 1; }
done

cluster=scripts/slurm-cluster
was_up=0
$cluster status >/dev/null 2>&1 && was_up=1
rc=0; $cluster start || rc=$?
[ "$rc" = 3 ] && { echo "SKIP: Slurm is not installed and cannot be installed here (needs root and apt-get)"; exit 77; }
[ "$rc" = 0 ] || { echo "FAIL: scripts/slurm-cluster start exited $rc"; exit 1; }
eval "$($cluster env)"

tmp=$(mktemp -d /tmp/gpt2p-slurm-test.XXXXXX)
jobs_started=()
cleanup() {
  for j in "${jobs_started[@]+"${jobs_started[@]}"}"; do scancel "$j" 2>/dev/null || true; done
  [ "$was_up" = 1 ] || $cluster stop >/dev/null 2>&1 || true
  [ -n "${KEEP:-}" ] && echo "kept $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT

# shellcheck source=../../scripts/lib.sh
source "$root/scripts/lib.sh"
gpt2p_test_data "$bin" "$tmp" || exit 1

# Two CPU ranks on the partition of scripts/slurm-cluster; the scripts' GPU defaults overridden.
submit=(--partition=cpu --nodes=1 --gpus-per-node=0 --ntasks-per-node=2 --cpus-per-task=1
        --time=00:15:00)
tiny=(--device cpu --preset tiny --max-train-pairs 128 --translate-samples 0 --data "$data")
export BIN=$bin GPT2P_ROOT=$root OMP_NUM_THREADS=1
fail=0
pass() { echo "PASS: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
show() { echo "  --- $1"; tail -n "${2:-25}" "$1" 2>/dev/null | sed 's/^/  | /'; }

# sbatch_wait NAME SCRIPT ARGS...: runs the job to its end; sets $job_rc and $job_out.
sbatch_wait() {
  local name=$1 script=$2; shift 2
  job_out=$tmp/$name.out
  job_rc=0
  RESULTS=$tmp/$name timeout 600 sbatch --wait --export=ALL "${submit[@]}" --job-name="gpt2p-$name" \
    --output="$job_out" "$script" "$@" >"$tmp/$name.sbatch" 2>&1 || job_rc=$?
}

# 1. Both trainers' job scripts.
for prog in dp pp; do
  sbatch_wait "$prog" "jobs/slurm_${prog}_train.sbatch" "${tiny[@]}" --max-steps 4
  if [ "$job_rc" = 0 ] && [ -s "$tmp/$prog/$prog/rank0.h5" ] && [ -s "$tmp/$prog/$prog/rank1.h5" ]; then
    pass "jobs/slurm_${prog}_train.sbatch: exit 0, $prog/rank0.h5 and rank1.h5"
  else
    bad "jobs/slurm_${prog}_train.sbatch: exit $job_rc; files: $(cd "$tmp/$prog" 2>/dev/null && find . -name 'rank*' | tr '\n' ' ')"
    show "$tmp/$prog.sbatch" 5; show "$job_out"
  fi
done

# 2. Pre-emption: SIGTERM to the job's steps (what --signal=TERM@120 sends before the time limit).
step_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["step"])' "$1" 2>/dev/null; }
first=$tmp/pre1
RESULTS=$first sbatch --wait --export=ALL "${submit[@]}" --job-name=gpt2p-pre1 --output="$tmp/pre1.out" \
  jobs/slurm_dp_train.sbatch "${tiny[@]}" --epochs 1000 --log-every 1 --save-every -1 \
  >"$tmp/pre1.sbatch" 2>&1 &
sbatch_pid=$!
job=
for _ in $(seq 100); do
  job=$(sed -n 's/^Submitted batch job \([0-9]*\).*/\1/p' "$tmp/pre1.sbatch")
  [ -n "$job" ] && break; sleep 0.1
done
[ -n "$job" ] && jobs_started+=("$job")
trained=0
for _ in $(seq 240); do  # up to 120 s for the job to start and log two steps
  n=$(grep -c ' step [0-9]*/' "$first/job.log" 2>/dev/null || true)
  [ "${n:-0}" -ge 2 ] && { trained=1; break; }
  kill -0 "$sbatch_pid" 2>/dev/null || break
  sleep 0.5
done
pre_rc=0
if [ "$trained" = 1 ]; then
  sent=$(date +%s)
  scancel --signal=TERM "$job"
  # The trainers save and exit within seconds; the job's time limit is far away.
  for _ in $(seq 240); do kill -0 "$sbatch_pid" 2>/dev/null || break; sleep 0.5; done
  kill -0 "$sbatch_pid" 2>/dev/null && { scancel "$job"; bad "pre-emption: job $job still running 120 s after SIGTERM"; }
  wait "$sbatch_pid" || pre_rc=$?
  took=$(( $(date +%s) - sent ))
  ck=$first/dp/checkpoint
  step=$(step_of "$ck/meta.json" || true)
  if [ "$pre_rc" = 75 ] && [ -n "$step" ]; then
    pass "pre-emption: scancel --signal=TERM -> exit 75 after ${took} s, checkpoint at step $step"
  else
    bad "pre-emption: exit $pre_rc (expected 75), checkpoint meta.json step '${step:-none}' in $ck"
    show "$tmp/pre1.out"
  fi
  if grep -q 'stopped by signal' "$tmp/pre1.out" && grep -q -- '--resume' "$tmp/pre1.out" &&
     grep 'stopped by signal\|--resume' "$tmp/pre1.out" | grep -qF "$ck"; then
    pass "pre-emption: the job says where the checkpoint is and how to resume: $(grep -m1 -- '--resume' "$tmp/pre1.out")"
  else
    bad "pre-emption: no line with 'stopped by signal', '--resume' and $ck in the job's output"
    show "$tmp/pre1.out" 10
  fi
  # The resumed job continues from the checkpoint's step.
  if [ -n "$step" ]; then
    target=$((step + 3))
    sbatch_wait pre2 jobs/slurm_dp_train.sbatch "${tiny[@]}" --epochs 1000 --log-every 1 \
      --save-every 1 --resume "$ck" --max-steps "$target"
    first_step=$(sed -n 's/.* step \([0-9]*\)\/.*/\1/p' "$tmp/pre2/job.log" 2>/dev/null | head -1)
    end_step=$(step_of "$tmp/pre2/dp/checkpoint/meta.json" || true)
    if [ "$job_rc" = 0 ] && [ "$first_step" = $((step + 1)) ] && [ "$end_step" = "$target" ]; then
      pass "resume: a second job with --resume $ck went on from step $((step + 1)) to $target, exit 0"
    else
      bad "resume: exit $job_rc, first step logged '${first_step:-none}' (expected $((step + 1))), final checkpoint step '${end_step:-none}' (expected $target)"
      show "$job_out"
    fi
  fi
else
  kill "$sbatch_pid" 2>/dev/null || true
  [ -n "$job" ] && scancel "$job" 2>/dev/null
  bad "pre-emption: job ${job:-?} did not log two training steps within 120 s"
  show "$tmp/pre1.sbatch" 5; show "$tmp/pre1.out"
fi

# 3. The PSC Bridges-2 set end to end, its site lines overridden (no modules, no venv, the build at
#    hand, the CPU partition instead of GPU-shared's V100s): the setup on the "login node", the
#    dataset job from the Ding file, then the dp and pp jobs on it. The setup builds nothing (its
#    build is there) and the GPU jobs must not build either.
b2=(--partition=cpu --nodes=1 --gpus=0 --ntasks-per-node=2 --cpus-per-task=1 --time=00:15:00)
b2_data=$tmp/b2/ding-gpt2.h5
if MODULES= VENV= bash jobs/bridges2_setup.sh >"$tmp/b2-setup.log" 2>&1 &&
   grep -q "setup: $bin has the programs" "$tmp/b2-setup.log"; then
  pass "jobs/bridges2_setup.sh: vocabulary and build found, nothing rebuilt"
else
  bad "jobs/bridges2_setup.sh failed"; show "$tmp/b2-setup.log"
fi
b2_rc=0
RESULTS=$tmp/b2-data MODULES= SOURCE=ding INPUT=/usr/share/trans/de-en DATA=$b2_data \
  DATA_FLAGS="--max-pairs 3000" timeout 600 sbatch --wait --export=ALL "${b2[@]}" \
  --job-name=gpt2p-b2-data --output="$tmp/b2-data.out" jobs/bridges2_data.sbatch \
  >"$tmp/b2-data.sbatch" 2>&1 || b2_rc=$?
if [ "$b2_rc" = 0 ] && [ "$(head -c 16 "$b2_data" 2>/dev/null)" = "gpt2p-dataset 1 " ]; then
  pass "jobs/bridges2_data.sbatch: exit 0, a dataset with its checksum block"
else
  bad "jobs/bridges2_data.sbatch: exit $b2_rc, dataset $(ls -la "$b2_data" 2>&1)"
  show "$tmp/b2-data.sbatch" 5; show "$tmp/b2-data.out"
fi
for prog in dp pp; do
  b2_rc=0
  RESULTS=$tmp/b2-$prog MODULES= timeout 600 sbatch --wait --export=ALL "${b2[@]}" \
    --job-name="gpt2p-b2-$prog" --output="$tmp/b2-$prog.out" "jobs/bridges2_${prog}_train.sbatch" \
    --device cpu --preset tiny --max-train-pairs 128 --translate-samples 0 --data "$b2_data" \
    --max-steps 4 >"$tmp/b2-$prog.sbatch" 2>&1 || b2_rc=$?
  if [ "$b2_rc" = 0 ] && [ -s "$tmp/b2-$prog/$prog/rank0.h5" ] && [ -s "$tmp/b2-$prog/$prog/rank1.h5" ]; then
    pass "jobs/bridges2_${prog}_train.sbatch: exit 0 on 2 ranks, $prog/rank0.h5 and rank1.h5"
  else
    bad "jobs/bridges2_${prog}_train.sbatch: exit $b2_rc"
    show "$tmp/b2-$prog.sbatch" 5; show "$tmp/b2-$prog.out"
  fi
done

[ "$fail" = 0 ] && echo "slurm: all checks passed" || echo "slurm: some checks failed"
exit "$fail"
