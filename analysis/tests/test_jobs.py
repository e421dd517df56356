"""The Slurm scripts and scripts/bench: syntax (bash -n) and their dry runs' launch lines, so that
breakage shows up here rather than in a queued job."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JOBS = sorted((ROOT / "jobs").glob("*.sbatch"))
# The trainers' and the benchmark's, one program each (bridges2_multinode takes it as an argument).
TRAIN_JOBS = [p for p in JOBS if p.stem not in ("bridges2_data", "bridges2_multinode")]


def run(cmd, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    e["GPT2P_PYTHON"] = sys.executable  # skips scripts/lib.sh's probe for a python with h5py
    e.update(env)
    return subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=60)


def test_there_are_bridges2_and_generic_jobs_for_each_program():
    names = {p.name for p in JOBS}
    for prefix in ("bridges2", "slurm"):
        for prog in ("dp_train", "pp_train", "bench"):
            assert f"{prefix}_{prog}.sbatch" in names


@pytest.mark.parametrize("script", [*JOBS, ROOT / "jobs" / "lib.sh", ROOT / "jobs" / "bridges2_setup.sh",
                                    ROOT / "scripts" / "bench"],
                         ids=lambda p: p.name)
def test_bash_syntax(script):
    r = run(["bash", "-n", str(script)])
    assert r.returncode == 0, r.stderr


def launch_line(stdout):
    lines = [l for l in stdout.splitlines() if l.startswith("launch: ")]
    assert len(lines) == 1, stdout
    return lines[0][len("launch: "):]


@pytest.mark.parametrize("script", TRAIN_JOBS, ids=lambda p: p.name)
def test_dry_run_prints_environment_and_launch_line(script):
    r = run(["bash", str(script), "--dry-run", "--epochs", "3"], SLURM_JOB_ID="4242", SLURM_SUBMIT_DIR=str(ROOT))
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert f"RESULTS={ROOT}/results/4242" in out and f"GPT2P_ROOT={ROOT}" in out
    line = launch_line(out)
    prog = script.stem.split("_", 1)[1]
    if prog == "bench":
        assert re.fullmatch(rf"env GPT2P_BIN=build-release scripts/bench --out {ROOT}/results/4242 --epochs 3", line)
    else:
        short = prog.split("_")[0]
        launcher = r"mpirun -np 2 --map-by ppr:2:node --bind-to core" if script.name.startswith("bridges2") \
            else r"srun --ntasks=2 --ntasks-per-node=2 --cpu-bind=cores --mpi=pmix"
        assert re.fullmatch(rf"{launcher} build-release/{prog} --out {ROOT}/results/4242/{short} --epochs 3",
                            line), line
    if script.name.startswith("bridges2"):
        assert "module load cuda" in out
        assert "#SBATCH --partition=GPU-shared" in script.read_text()
        assert "#SBATCH --gpus=v100-32:2" in script.read_text()
    assert not (ROOT / "results" / "4242").exists()  # a dry run creates nothing


@pytest.mark.parametrize("where", ["before", "after"])
@pytest.mark.parametrize("prog", ["dp_train", "pp_train", "bench"])
def test_multinode_dry_run_launches_one_rank_per_gpu_of_every_node(prog, where):
    args = ["--dry-run", prog] if where == "before" else [prog, "--dry-run"]
    r = run(["bash", "jobs/bridges2_multinode.sbatch", *args, "--epochs", "3"], SLURM_JOB_ID="4242",
            SLURM_SUBMIT_DIR=str(ROOT))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "NODES=2 RANKS_PER_NODE=8 RANKS=16" in r.stdout
    line = launch_line(r.stdout)
    if prog == "bench":
        assert line == (f"env GPT2P_BIN=build-release GPT2P_MPIRUN=mpirun --map-by node scripts/bench "
                        f"--no-build --out {ROOT}/results/4242 --epochs 3")
    else:
        assert line == (f"mpirun -np 16 --map-by ppr:8:node --bind-to core build-release/{prog} "
                        f"--out {ROOT}/results/4242/{prog.split('_')[0]} --epochs 3")
    text = (ROOT / "jobs" / "bridges2_multinode.sbatch").read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --gpus=v100-32:16" in text
    assert not (ROOT / "results" / "4242").exists()


def test_multinode_job_without_a_program_is_a_usage_error():
    r = run(["bash", "jobs/bridges2_multinode.sbatch", "--dry-run", "--epochs", "3"], SLURM_JOB_ID="4242")
    assert r.returncode == 2
    assert "the first argument picks the program: dp_train, pp_train or bench (not '--epochs')" in r.stderr


def test_dry_run_by_env_and_multi_node_ranks():
    r = run(["bash", "jobs/slurm_dp_train.sbatch"], DRY_RUN="1", SLURM_JOB_NUM_NODES="2",
            RANKS_PER_NODE="4", SLURM_JOB_ID="7")
    assert r.returncode == 0, r.stderr
    assert launch_line(r.stdout).startswith("srun --ntasks=8 --ntasks-per-node=4 ")


def test_unknown_launcher_is_reported():
    r = run(["bash", "jobs/slurm_pp_train.sbatch", "--dry-run"], LAUNCHER="qsub", SLURM_JOB_ID="8")
    assert r.returncode != 0
    assert "LAUNCHER='qsub' is neither srun nor mpirun" in r.stderr


def test_bench_dry_run_lists_the_hw5_matrix(tmp_path):
    r = run(["scripts/bench", "--quick", "--dry-run", "--out", str(tmp_path / "b"),
             "--schedules", "gpipe 1f1b", "--microbatches", "2 4 8"])
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.splitlines() if l.startswith("+ ")]
    trainers = [l for l in lines if "_train" in l and "-m analysis" not in l]
    assert len(trainers) == 2 + 1 + 2 * 3
    assert "-np 1" in trainers[0] and "-np 2" in trainers[1]
    assert "--mode model_parallel" in trainers[2]
    assert sum("--schedule gpipe --microbatches 4" in l for l in trainers) == 1
    hw5 = [l for l in lines if " hw5 " in l][0]
    assert f"--pp-pipeline {tmp_path}/b/pp_gpipe_m4" in hw5


def test_bridges2_data_dry_runs_name_their_inputs():
    r = run(["bash", "jobs/bridges2_data.sbatch", "--dry-run"], SLURM_JOB_ID="4243", HOME="/home/u")
    assert r.returncode == 0, r.stdout + r.stderr
    assert launch_line(r.stdout) == ("build-release/prepare_data --source ding --input /home/u/de-en "
                                     "--out .cache/data/ding-gpt2.h5")
    r = run(["bash", "jobs/bridges2_data.sbatch", "--dry-run", "--max-pairs", "9"], SLURM_JOB_ID="4243",
            SOURCE="jsonl", JSONL_DIR="/d", DATA="/x/iwslt.h5")
    assert r.returncode == 0, r.stdout + r.stderr
    assert launch_line(r.stdout) == ("build-release/prepare_data --source jsonl --train /d/train.jsonl "
                                     "--validation /d/validation.jsonl --test /d/test.jsonl "
                                     "--out /x/iwslt.h5 --max-pairs 9")
    r = run(["bash", "jobs/bridges2_data.sbatch", "--dry-run"], SLURM_JOB_ID="4243", SOURCE="csv")
    assert r.returncode == 2 and "SOURCE=csv is neither ding nor jsonl" in r.stderr
    assert not (ROOT / "results" / "4243").exists()


def test_bridges2_setup_dry_run_makes_the_venv_and_builds_once():
    r = run(["bash", "jobs/bridges2_setup.sh", "--dry-run"], SLURM_JOB_ID="4244", VENV="/nonexistent/venv",
            BIN="/nonexistent/build")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "module load cuda" in out
    assert "setup: python3 -m venv /nonexistent/venv" in out
    assert re.search(r"setup: /nonexistent/venv/bin/pip install torch --index-url \S+/cu12\d h5py", out), out
    assert "setup: gpt2p_build /nonexistent/build -DGPT2P_BUILD_TESTS=OFF" in out
    assert not (ROOT / "results" / "4244").exists()


def test_bridges2_gpu_jobs_do_not_build(tmp_path):
    """A GPU job whose build is missing stops at once with the fix: it must not compile on GPU hours."""
    r = run(["bash", "jobs/bridges2_dp_train.sbatch"], SLURM_JOB_ID="4245", MODULES="", BIN="/nonexistent/build",
            RESULTS=str(tmp_path / "r"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "/nonexistent/build/dp_train is missing: build once with jobs/bridges2_setup.sh" in r.stderr
