#!/usr/bin/env bash
# Every program across the nodes of a 2-node cluster on this machine (scripts/cluster: network
# namespaces, Slurm, CPU ranks, 2 ranks per node), and the faults only clusters have.
#   1. Across nodes, each against the same 4 ranks on one host (plain mpirun here), bitwise equal
#      losses, rank files on both hosts: dp_train bucketed (jobs/slurm_dp_train.sbatch, srun; its
#      log shows the start-up line's hosts and Open MPI's TCP connections between the nodes),
#      dp_train --zero 1 (jobs/bridges2_multinode.sbatch, mpirun under Slurm), pp_train, a 4-stage
#      pipeline (jobs/slurm_pp_train.sbatch), the hybrid --dp 2 with a replica per node
#      (jobs/bridges2_multinode.sbatch), dp_train through `scripts/cluster mpirun` (no Slurm), and
#      HW5's scripts/bench --quick (jobs/bridges2_multinode.sbatch bench: its 2-rank runs on 2
#      nodes).
#   2. Faults, each run $REPEATS times (default 3), timed, and written to $work/faults.tsv (and to
#      $CLUSTER_FAULTS when set):
#      link   node2's link goes down mid-run (--comm-timeout 10): every rank exits within 20 s,
#             the job within 25 s, node1's ranks name node2's; Slurm marks the job failed; once
#             the link is back, the last checkpoint resumes on both nodes;
#      kill   node2 dies (every process on it killed): the job ends within 30 s naming a rank;
#      data   --data exists on node1's /tmp only: one line naming it, every rank exits;
#      preempt  scancel --signal=TERM (srun) and scancel --batch --signal=USR1 (mpirun, through
#             the job script): exit 75, every rank stopped after the checkpoint's step; the
#             checkpoint resumes on 1 node (4 ranks) and on 2.
# Usage: tests/cluster/run_cluster.sh [BUILD_DIR]   (needs dp_train, pp_train, pp_plan, prepare_data)
#   REPEATS=N, CLUSTER_CASES="link kill" (some of: programs link kill data preempt), KEEP=1 (keep
#   the work folder), CLUSTER_FAULTS=FILE (a copy of the fault table).
# Exit 77 (skipped) where the cluster cannot be made (not root, no Slurm and no apt-get). A cluster
# this test started is taken down at the end, also after a failure; one that ran before is kept.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(cd "${1:-$root/build}" && pwd)
cd "$root"
for p in dp_train pp_train pp_plan prepare_data; do
  [ -x "$bin/$p" ] || { echo "FAIL: $bin/$p is missing: build it first"; exit 1; }
done
repeats=${REPEATS:-3}
cluster=scripts/cluster
cdir=${GPT2P_CLUSTER_DIR:-/var/tmp/gpt2p-cluster}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

was_up=0
$cluster status >/dev/null 2>&1 && was_up=1
rc=0; $cluster up 2 || rc=$?
[ "$rc" = 3 ] && { echo "SKIP: no cluster here: network namespaces and Slurm need root (and apt-get where Slurm is missing)"; exit 77; }
[ "$rc" = 0 ] || { echo "FAIL: scripts/cluster up 2 exited $rc"; exit 1; }
eval "$($cluster env)"
mkdir -p "$cdir/work"
work=$(mktemp -d "$cdir/work/test.XXXXXX")  # outside /tmp: the nodes share it
jobs_started=()
cleanup() {
  for j in "${jobs_started[@]+"${jobs_started[@]}"}"; do scancel "$j" 2>/dev/null || true; done
  $cluster link node2 up >/dev/null 2>&1 || true
  if [ "$was_up" = 1 ]; then $cluster up 2 >/dev/null 2>&1 || true; else $cluster down >/dev/null 2>&1 || true; fi
  [ -n "${KEEP:-}" ] && echo "kept $work" || rm -rf "$work"
}
trap cleanup EXIT

# shellcheck source=../../scripts/lib.sh
source "$root/scripts/lib.sh"
gpt2p_test_data "$bin" "$work" || exit 1

fail=0
pass() { echo "PASS: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
show() { echo "  --- $1"; tail -n "${2:-25}" "$1" 2>/dev/null | sed 's/^/  | /'; }
py=$(scripts/python --which h5py numpy)
export BIN=$bin GPT2P_ROOT=$root MODULES= VENV=

# Site lines overridden for this cluster: its partition, 2 nodes x 2 CPU ranks, no GPUs.
site=(--partition=cluster --gpus=0 --gpus-per-node=0 --cpus-per-task=1 --time=00:15:00)
layout=(--nodes=2 --ntasks-per-node=2)
tiny_nodata=(--device cpu --preset tiny --max-train-pairs 256 --translate-samples 0 --log-every 1)
tiny=("${tiny_nodata[@]}" --data "$data")

# submit NAME SCRIPT [sbatch flags] -- [job args]: runs a job in the background; sets $job.
submit() {
  local name=$1 script=$2; shift 2
  local flags=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do flags+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  RESULTS=$work/$name sbatch --parsable --export=ALL "${site[@]}" "${layout[@]}" "${flags[@]}" \
    --job-name="gpt2p-$name" --output="$work/$name.out" "$script" "$@" >"$work/$name.sbatch" 2>&1 ||
    { bad "$name: sbatch refused the job"; show "$work/$name.sbatch" 5; job=; job_rc=none; return 1; }
  job=$(cut -d';' -f1 "$work/$name.sbatch")
  jobs_started+=("$job")
}
job_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
job_exit() { scontrol show job "$1" 2>/dev/null | sed -n 's/.* ExitCode=\([0-9]*\):.*/\1/p'; }
# wait_job JOB SECONDS: until Slurm has the job ended; sets $job_rc (its batch script's exit).
wait_job() {
  local i state
  for i in $(seq $(( $2 * 2 ))); do
    state=$(job_state "$1")
    case "$state" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|PREEMPTED|OUT_OF_MEMORY) break ;; esac
    sleep 0.5
  done
  job_rc=$(job_exit "$1"); job_rc=${job_rc:-none}
}
# run_job NAME SCRIPT [sbatch flags] -- [job args]: submits and waits (10 min at most).
run_job() { submit "$@" && wait_job "$job" 600; return 0; }
# steps_logged NAME: training steps in the job's output so far.
steps_logged() { local n; n=$(grep -c ' step [0-9]*/' "$work/$1.out" 2>/dev/null || true); echo "${n:-0}"; }
wait_steps() {  # wait_steps NAME N: until the job has logged N steps (120 s at most)
  local i
  for i in $(seq 240); do
    [ "$(steps_logged "$1")" -ge "$2" ] && return 0
    case "$(job_state "$job")" in COMPLETED|FAILED|CANCELLED) return 1 ;; esac
    sleep 0.5
  done
  return 1
}
# reference NAME NP PROGRAM ARGS...: the same run on one host (this machine), plain mpirun.
reference() {
  local name=$1 np=$2 prog=$3; shift 3
  mpirun --oversubscribe -np "$np" "$bin/$prog" "$@" --out "$work/ref-$name" >"$work/ref-$name.log" 2>&1 ||
    { bad "$name: the single-node reference run failed"; show "$work/ref-$name.log" 10; }
}
same() {  # same NAME CLUSTER_RUN REFERENCE_RUN
  local msg
  if msg=$("$py" tests/cluster/same_run.py "$2" "$3" --hosts 2 2>&1); then
    pass "$1 across 2 nodes: $msg"
  else
    bad "$1 across 2 nodes: $msg"; show "$work/$1.out" 15
  fi
}
# CLUSTER_CASES picks some of: programs link kill data preempt (default: all).
want() { [[ " ${CLUSTER_CASES:-programs link kill data preempt} " == *" $1 "* ]]; }
meta_step() { "$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["step"])' "$1" 2>/dev/null; }

# ---- 1. every program across the nodes ----------------------------------------------------------
steps=(--max-steps 6)
if want programs; then
# dp_train, bucketed, srun; Open MPI says which transport it takes between the nodes.
OMPI_MCA_btl_base_verbose=100 run_job dp jobs/slurm_dp_train.sbatch -- "${tiny[@]}" "${steps[@]}"
reference dp 4 dp_train "${tiny[@]}" "${steps[@]}"
if [ "$job_rc" = 0 ]; then same dp "$work/dp/dp" "$work/ref-dp"; else bad "dp: job exit $job_rc"; show "$work/dp.out"; fi
if grep -q "across 2 hosts: node1 (ranks 0-1), node2 (ranks 2-3)" "$work/dp.out"; then
  pass "dp: the start-up line says where the ranks run: $(grep -o 'across 2 hosts: [^,]*, [^,]*)' "$work/dp.out" | head -1)"
else
  bad "dp: no start-up line with 'across 2 hosts: node1 (ranks 0-1), node2 (ranks 2-3)'"
fi
tcp=$(grep -o 'btl:tcp: connect() to 10\.[0-9.]*:[0-9]* completed' "$work/dp.out" | sort -u | head -2 | tr '\n' ';' || true)
if grep -q '^\[node1:.*btl:tcp: connect() to .* completed' "$work/dp.out" ||
   grep -q '^\[node2:.*btl:tcp: connect() to .* completed' "$work/dp.out"; then
  pass "dp: Open MPI's TCP transport between the nodes: $tcp"
else
  bad "dp: the job's log shows no TCP connection between the nodes (OMPI_MCA_btl_base_verbose=100)"
fi

# dp_train --zero 1 through the Bridges-2 multi-node script (mpirun under Slurm).
run_job zero jobs/bridges2_multinode.sbatch -- dp_train "${tiny[@]}" "${steps[@]}" --zero 1
reference zero 4 dp_train "${tiny[@]}" "${steps[@]}" --zero 1
if [ "$job_rc" = 0 ]; then same zero "$work/zero/dp" "$work/ref-zero"; else bad "zero: job exit $job_rc"; show "$work/zero.out"; fi

# A 4-stage pipeline: stages 0-1 on node1, 2-3 on node2; the activations cross the network.
pp=(--n-layer 4 --schedule 1f1b --microbatches 4)
run_job pp jobs/slurm_pp_train.sbatch -- "${tiny[@]}" "${steps[@]}" "${pp[@]}"
reference pp 4 pp_train "${tiny[@]}" "${steps[@]}" "${pp[@]}"
if [ "$job_rc" = 0 ]; then same pp "$work/pp/pp" "$work/ref-pp"; else bad "pp: job exit $job_rc"; show "$work/pp.out"; fi

# The hybrid: 2 replicas of a 2-stage pipeline, replica 0 on node1 and replica 1 on node2.
run_job hybrid jobs/bridges2_multinode.sbatch -- pp_train "${tiny[@]}" "${steps[@]}" --dp 2 --microbatches 2
reference hybrid 4 pp_train "${tiny[@]}" "${steps[@]}" --dp 2 --microbatches 2
if [ "$job_rc" = 0 ]; then same hybrid "$work/hybrid/pp" "$work/ref-hybrid"; else bad "hybrid: job exit $job_rc"; show "$work/hybrid.out"; fi

# Without Slurm: mpirun from node1, node2's ranks through the launch agent.
rc=0
timeout 300 $cluster mpirun -np 4 "$bin/dp_train" "${tiny[@]}" "${steps[@]}" --out "$work/mpirun-dp" \
  >"$work/mpirun-dp.out" 2>&1 || rc=$?
if [ "$rc" = 0 ]; then same "scripts/cluster mpirun dp_train" "$work/mpirun-dp" "$work/ref-dp"
else bad "scripts/cluster mpirun: exit $rc"; show "$work/mpirun-dp.out"; fi

# HW5's bench, its 2-rank runs across the nodes, against the same bench on one host.
run_job bench jobs/bridges2_multinode.sbatch -- bench --quick
rc=0
GPT2P_BIN=$bin timeout 600 scripts/bench --quick --no-build --out "$work/ref-bench" >"$work/ref-bench.log" 2>&1 || rc=$?
if [ "$job_rc" = 0 ] && [ "$rc" = 0 ] && [ -s "$work/bench/hw5/performance_summary.json" ]; then
  for run in dp2 pp_mp pp_1f1b_m4; do same "bench $run" "$work/bench/$run" "$work/ref-bench/$run"; done
else
  bad "bench: job exit $job_rc, single-node bench exit $rc, $work/bench/hw5/performance_summary.json $( [ -s "$work/bench/hw5/performance_summary.json" ] && echo present || echo missing)"
  show "$work/bench.out"; show "$work/ref-bench.log" 10
fi
fi

# ---- 2. faults --------------------------------------------------------------------------------
faults=$work/faults.tsv
printf 'fault\trun\tjob_exit\tranks_end_s\tjob_end_s\tdetail\n' >"$faults"
long=("${tiny[@]}" --epochs 1000 --comm-timeout 10)
# ended_after NAME T0: seconds from T0 until no trainer runs on any node (ranks_end) and until the
# job's batch script has ended (job_end), polled every 0.2 s for 120 s at most.
ranks_gone() { ! { ip netns pids gpt2p-node1; ip netns pids gpt2p-node2; } 2>/dev/null |
                 xargs -r ps -o comm= -p 2>/dev/null | grep -q '_train$'; }
script_gone() { ! ip netns pids gpt2p-node1 2>/dev/null | xargs -r ps -o args= -p 2>/dev/null | grep -q 'slurm_script'; }
since() { awk -v a="$1" -v b="${2:-$(date +%s.%N)}" 'BEGIN { print b - a }'; }
ended_after() {
  local t0=$1 i now
  ranks_end=none; job_end=none
  for i in $(seq 600); do
    now=$(date +%s.%N)
    [ "$ranks_end" = none ] && ranks_gone && ranks_end=$(since "$t0" "$now")
    [ "$job_end" = none ] && script_gone && job_end=$(since "$t0" "$now")
    [ "$ranks_end" != none ] && [ "$job_end" != none ] && return 0
    sleep 0.2
  done
}
within() { [ "$1" != none ] && awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }
row() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$faults"; }
fmt() { [ "$1" = none ] && echo none || printf '%.1f' "$1"; }

# Link down: node2 drops off the network 3 steps into a run that checkpoints every 2 steps.
want link && for i in $(seq "$repeats"); do
  name=link$i
  submit "$name" jobs/slurm_dp_train.sbatch -- "${long[@]}" --save-every 2 || continue
  if ! wait_steps "$name" 3; then bad "$name: the job did not train"; show "$work/$name.out"; continue; fi
  t0=$(date +%s.%N)
  $cluster link node2 down >/dev/null
  ended_after "$t0"
  named=$(grep -o 'ranks* [0-9, -]* on node2 did not answer a roll call within [0-9.]* s' "$work/$name.out" | head -1 || true)
  $cluster link node2 up >/dev/null
  wait_job "$job" 120
  state=$(job_state "$job")
  row link "$i" "$job_rc" "$(fmt "$ranks_end")" "$(fmt "$job_end")" "${named:-no rank named}; Slurm: $state"
  if within "$ranks_end" 20 && within "$job_end" 25 && [ -n "$named" ] && [ "$state" = FAILED ]; then
    pass "$name: link down -> ranks ended after $(fmt "$ranks_end") s, the job after $(fmt "$job_end") s, Slurm: $state; '$named'"
  else
    bad "$name: link down -> ranks ended after $(fmt "$ranks_end") s (<= 20), the job after $(fmt "$job_end") s (<= 25), Slurm: $state (FAILED), named: '${named:-none}'"
    show "$work/$name.out" 15
  fi
  # The last checkpoint resumes, on both nodes again.
  ck=$work/$name/dp/checkpoint; step=$(meta_step "$ck/meta.json" || true)
  if [ -z "$step" ]; then bad "$name: no committed checkpoint in $ck"; continue; fi
  run_job "$name-resume" jobs/slurm_dp_train.sbatch -- "${long[@]}" --resume "$ck" --max-steps $((step + 2))
  first=$(sed -n 's/.* step \([0-9]*\)\/.*/\1/p' "$work/$name-resume.out" 2>/dev/null | head -1 || true)
  if [ "$job_rc" = 0 ] && [ "$first" = $((step + 1)) ]; then
    pass "$name: the checkpoint of step $step resumed on 2 nodes from step $first"
  else
    bad "$name: resume from step $step: exit $job_rc, first step '${first:-none}'"; show "$work/$name-resume.out"
  fi
done

# A node dies: every process on node2 (its slurmd, step daemons and ranks) killed at once.
want kill && for i in $(seq "$repeats"); do
  name=kill$i
  submit "$name" jobs/slurm_dp_train.sbatch -- "${long[@]}" --save-every -1 || continue
  if ! wait_steps "$name" 3; then bad "$name: the job did not train"; show "$work/$name.out"; continue; fi
  t0=$(date +%s.%N)
  $cluster kill node2 >/dev/null
  ended_after "$t0"
  # Named by the roll call, or, where the dead node's sockets closed first, by Open MPI's TCP
  # transport ("Peer host: node2") or Slurm ("Node failure on node2"); the start-up line maps the
  # host to its ranks.
  named=$(grep -o 'ranks* [0-9, -]* on node2 did not answer[^)]*)' "$work/$name.out" | head -1 || true)
  [ -n "$named" ] || named=$(grep -o 'Peer host: *node2\|Node failure on node2' "$work/$name.out" | head -1 | tr -s ' ' || true)
  [ -n "$named" ] && grep -q 'across 2 hosts: node1 (ranks 0-1), node2 (ranks 2-3)' "$work/$name.out" &&
    case "$named" in ranks*) ;; *) named="$named (ranks 2-3, as the start-up line places them)" ;; esac
  wait_job "$job" 90
  row kill "$i" "$job_rc" "$(fmt "$ranks_end")" "$(fmt "$job_end")" "${named:-no rank named}"
  if within "$job_end" 30 && [ -n "$named" ]; then
    pass "$name: node2 killed -> node1's ranks ended after $(fmt "$ranks_end") s, the job after $(fmt "$job_end") s; '$named'"
  else
    bad "$name: node2 killed -> ranks ended after $(fmt "$ranks_end") s, the job after $(fmt "$job_end") s (<= 30), named: '${named:-none}'"
    show "$work/$name.out" 15
  fi
  $cluster up 2 >/dev/null || bad "$name: scripts/cluster up did not bring node2 back"
done

# --data on node1's own /tmp only: node2's ranks cannot open it.
want data && $cluster exec node1 cp "$data" /tmp/gpt2p-node-local.h5
want data && for i in $(seq "$repeats"); do
  name=data$i
  t0=$(date +%s.%N)
  run_job "$name" jobs/slurm_dp_train.sbatch -- "${tiny_nodata[@]}" --data /tmp/gpt2p-node-local.h5 --max-steps 2
  took=$(since "$t0")
  # The trainers' lines, not the job script's echo of its launch line.
  lines=$(grep -v '^launch: ' "$work/$name.out" | grep -c '/tmp/gpt2p-node-local.h5' || true)
  line=$(grep -v '^launch: ' "$work/$name.out" | grep -m1 '/tmp/gpt2p-node-local.h5' | cut -c1-160 || true)
  row data "$i" "$job_rc" "-" "$(fmt "$took")" "$lines line(s): $line"
  if [ "$job_rc" != 0 ] && [ "$job_rc" != none ] && [ "$lines" = 1 ] && grep -q 'node2' <<<"$line"; then
    pass "$name: data missing on node2 -> exit $job_rc after $(fmt "$took") s, one line: $line"
  else
    bad "$name: data missing on node2 -> exit $job_rc, $lines line(s) naming the file (1, naming node2)"; show "$work/$name.out" 15
  fi
done

# Pre-emption: TERM to the srun step's ranks on both nodes; USR1 to the job script (mpirun).
preempt() {  # preempt NAME SCRIPT SIGNAL SCANCEL_FLAGS JOB_ARGS...
  local name=$1 script=$2 sig=$3 how=$4; shift 4
  submit "$name" "$script" -- "$@" "${long[@]}" --save-every -1 || return 0
  if ! wait_steps "$name" 3; then bad "$name: the job did not train"; show "$work/$name.out"; return 0; fi
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  scancel $how --signal="$sig" "$job"
  wait_job "$job" 120
  took=$(since "$t0")
  local ck=$work/$name/dp/checkpoint step last
  step=$(meta_step "$ck/meta.json" || true)
  last=$("$py" - "$work/$name/dp" <<'EOF'
import sys
from analysis import reader
run = reader.read_run(sys.argv[1])
print(" ".join(str(int(r.table("steps")["step"][-1])) for r in run.ranks))
EOF
)
  row "preempt-$sig" 1 "$job_rc" "-" "$(fmt "$took")" "checkpoint after step ${step:-none}; last timed step per rank (from 0): $last"
  # The timing files count steps from 0, the checkpoint the steps done: every rank's last row is
  # the checkpoint's step - 1.
  if [ "$job_rc" = 75 ] && [ -n "$step" ] && [ "$(tr ' ' '\n' <<<"$last" | sort -u)" = "$((step - 1))" ]; then
    pass "$name: scancel $how --signal=$sig -> exit 75 after $(fmt "$took") s, one checkpoint after step $step, every rank's last step $step"
  else
    bad "$name: scancel $how --signal=$sig -> exit $job_rc (75), checkpoint step '${step:-none}', last step per rank '$last'"
    show "$work/$name.out" 15; return 0
  fi
  # On 1 node: 4 ranks on node1 alone (mpirun inside the node: its 2 Slurm slots cannot take
  # 4 tasks); on 2 nodes: through the same job script.
  local where first
  for where in 1 2; do
    if [ "$where" = 1 ]; then
      job_rc=0
      timeout 300 $cluster exec node1 mpirun --oversubscribe -np 4 "$bin/dp_train" "${long[@]}" \
        --resume "$ck" --max-steps $((step + 2)) --out "$work/$name-resume1/dp" \
        >"$work/$name-resume1.out" 2>&1 || job_rc=$?
    else
      run_job "$name-resume2" "$script" -- "$@" "${long[@]}" --resume "$ck" --max-steps $((step + 2))
    fi
    first=$(sed -n 's/.* step \([0-9]*\)\/.*/\1/p' "$work/$name-resume$where.out" 2>/dev/null | head -1 || true)
    if [ "$job_rc" = 0 ] && [ "$first" = $((step + 1)) ]; then
      pass "$name: resumed on $where node(s) (4 ranks) from step $first"
    else
      bad "$name: resume on $where node(s): exit $job_rc, first step '${first:-none}' (expected $((step + 1)))"
      show "$work/$name-resume$where.out"
    fi
  done
}
if want preempt; then
  preempt preempt-term jobs/slurm_dp_train.sbatch TERM ""
  preempt preempt-usr1 jobs/bridges2_multinode.sbatch USR1 --batch dp_train
fi

echo "--- fault table ($faults)"; column -t -s $'\t' "$faults" | sed 's/^/  /'
[ -n "${CLUSTER_FAULTS:-}" ] && cp "$faults" "$CLUSTER_FAULTS"
[ "$fail" = 0 ] && echo "cluster: all checks passed" || echo "cluster: some checks failed"
exit "$fail"
