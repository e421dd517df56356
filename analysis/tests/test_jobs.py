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


@pytest.mark.parametrize("script", [*JOBS, ROOT / "jobs" / "lib.sh", ROOT / "scripts" / "bench"],
                         ids=lambda p: p.name)
def test_bash_syntax(script):
    r = run(["bash", "-n", str(script)])
    assert r.returncode == 0, r.stderr


def launch_line(stdout):
    lines = [l for l in stdout.splitlines() if l.startswith("launch: ")]
    assert len(lines) == 1, stdout
    return lines[0][len("launch: "):]


@pytest.mark.parametrize("script", JOBS, ids=lambda p: p.name)
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
