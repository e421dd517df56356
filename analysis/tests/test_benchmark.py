"""scripts/benchmark: its dry runs (the commands, anchors and repetitions it would run) on
scripts/matrices/cpu-smoke.tsv, every matrix and a matrix with anchors; its one-line errors; and,
where the programs are built (GPT2P_BIN or build/), a real run of two tiny CPU rows and a refusal."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "scripts" / "benchmark"
MATRICES = sorted((ROOT / "scripts" / "matrices").glob("*.tsv"))


def bench(*args, timeout=60, **env):
    e = dict(os.environ, GPT2P_PYTHON=sys.executable)
    e.pop("GPT2P_GPUS", None)
    e.update(env)
    return subprocess.run([str(RUNNER), *map(str, args)], cwd=ROOT, env=e, capture_output=True, text=True,
                          timeout=timeout)


def commands(stdout):
    return [line[2:] for line in stdout.splitlines() if line.startswith("+ ")]


def test_syntax_and_shellcheck():
    for script in (RUNNER, ROOT / "scripts" / "gpu-check"):
        r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        if shutil.which("shellcheck"):
            r = subprocess.run(["shellcheck", "-x", script.name], cwd=script.parent, capture_output=True, text=True)
            assert r.returncode == 0, r.stdout


def test_dry_run_of_the_cpu_smoke_matrix(tmp_path):
    r = bench("cpu-smoke", "--dry-run", "--repeat", "2", "--out", tmp_path / "o", "--bin", "bin")
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "o").exists()  # a dry run writes nothing
    cmds = commands(r.stdout)
    rows = ["dp-np1", "dp-np2", "plan", "pp-mp", "pp-1f1b-m2", "refused"]
    runs = [c for c in cmds if " mpirun " in c]
    assert len(runs) == 2 * len(rows)
    assert [re.search(r"/runs/([^/]+)/rep(\d)", c).groups() for c in runs] == \
        [(n, str(rep)) for rep in (1, 2) for n in rows]
    assert r.stdout.index("== repetition 2 of 2") > r.stdout.index(runs[len(rows) - 1])
    out = tmp_path / "o"
    dp2 = runs[1]
    assert dp2.startswith("OMP_NUM_THREADS=1 timeout 120 mpirun -np 2 -x OMP_NUM_THREADS bin/dp_train ")
    for flag in ("--data .cache/data/ding-gpt2.h5", "--epochs 1", "--max-steps 6", "--max-train-pairs 768",
                 "--max-eval-pairs 16", "--log-every 10", "--save-every -1",
                 "--translate-samples 0", "--overwrite", f"--out {out}/runs/dp-np2/rep1",
                 "--device cpu --preset tiny --batch-size 16 --seq-len 32"):
        assert flag in dp2, flag
    plan = runs[2]
    assert "bin/pp_plan --data .cache/data/ding-gpt2.h5" in plan and f"--json-out {out}/runs/plan/rep1/plan.json" in plan
    assert "--epochs" not in plan and "--out" not in plan.replace("--json-out", "")
    assert "rc=2" not in runs[5] and "--grad-accum 3" in runs[5]
    assert cmds[-1].endswith(f"-m analysis.matrix_table {out} --warmup 2 ...")
    assert not [c for c in cmds if "anchor" in c]


def test_anchors_run_once_per_configuration_and_repetition(tmp_path):
    m = tmp_path / "m.tsv"
    m.write_text("# With anchors\n# repeat: 2\n# steps: 12\n# warmup: 3\n" + "".join("\t".join(r) + "\n" for r in (
        ("a", "1", "dp_train", "compile:16x1024xbf16", "-", "--precision bf16 --max-steps 5"),
        ("b", "1", "dp_train", "compile:64x128xfp32+tf32", "a", "--profile {out}/profile"),
        ("c", "2", "dp_train", "ddp:64x128xfp32", "a", "-"),
        ("d", "1", "dp_train", "ddp:64x128xfp32", "-", "-"),
        ("e", "2", "pp_train", "pp:64x128xfp32:model_parallel", "-", "--mode model_parallel"),
        ("f", "2", "pp_train", "pp:64x128xfp32:onef1b:4", "e", "-"),
        ("g", "2", "pp_train", "pp:64x128xfp32:gpipe:8", "e", "-"),
        ("h", "2", "comm_bench", "comm", "-", "--op all"))))
    # The anchors' folder named explicitly (the default is scripts/peers/).
    peers = tmp_path / "peers"
    peers.mkdir()
    r = bench(m, "--dry-run", "--out", tmp_path / "o", GPT2P_GPUS="2", GPT2P_ANCHORS=str(peers))
    assert r.returncode == 0, r.stderr
    assert "results/" not in r.stdout and "m.tsv: 8 row(s), 2 repetition(s)" in r.stdout
    cmds = commands(r.stdout)
    anchors = [c for c in cmds if f"python3 {peers}/" in c]
    want = [f"PYTHONUNBUFFERED=1 CONFIGS=16x1024xbf16 TF32=0 WORLD=1 timeout 300 python3 {peers}/compile_anchor.py",
            f"PYTHONUNBUFFERED=1 CONFIGS=64x128xfp32 TF32=1 WORLD=1 timeout 300 python3 {peers}/compile_anchor.py",
            f"PYTHONUNBUFFERED=1 CONFIGS=64x128xfp32 timeout 300 python3 {peers}/ddp_anchor.py",
            f"PYTHONUNBUFFERED=1 CONFIGS=64x128xfp32 SCHEDULES=onef1b:4,gpipe:8 timeout 300 python3 {peers}/pp_anchor.py",
            f"PYTHONUNBUFFERED=1 timeout 300 python3 {peers}/comm_anchor.py"]
    assert anchors == want * 2
    # Each repetition: every row, then every anchor.
    kinds = ["anchor" if f"python3 {peers}/" in c else "row" for c in cmds if "matrix_table" not in c]
    assert kinds == (["row"] * 8 + ["anchor"] * 5) * 2
    a = cmds[0]
    assert a.count("--max-steps") == 1 and "--max-steps 5" in a and "--max-train-pairs 1536" in a
    assert f"--json-out {tmp_path}/o/runs/h/rep1/comm_bench.json" in cmds[7]
    assert cmds[1].endswith(f"--out {tmp_path}/o/runs/b/rep1 --profile {tmp_path}/o/runs/b/rep1/profile")
    # One GPU: ddp_anchor.py's single-GPU mode alone (its main() would wait for a second GPU).
    r = bench(m, "--dry-run", "--rows", "d", "--out", tmp_path / "o", GPT2P_GPUS="1",
              GPT2P_ANCHORS=str(peers))
    assert [c for c in commands(r.stdout) if "ddp_anchor" in c] == [
        f"PYTHONUNBUFFERED=1 CONFIGS=64x128xfp32 timeout 300 python3 -c '<ddp_anchor.run in its single-GPU mode>' {peers}"] * 2


@pytest.mark.parametrize("matrix", MATRICES, ids=lambda p: p.stem)
def test_every_matrix_dry_runs(matrix):
    r = bench(matrix.stem, "--dry-run", GPT2P_GPUS="2")
    assert r.returncode == 0, r.stderr
    first = matrix.read_text().splitlines()[0]
    assert first.startswith("# ") and len(first) > 10  # the title README.md is given
    cmds = commands(r.stdout)
    assert cmds and all("mpirun -np" in c or "python3" in c for c in cmds), r.stdout
    default_out = re.search(r"-> (\S+)", r.stdout).group(1)
    assert re.fullmatch(rf"results/\d{{4}}-\d\d-\d\d-gpux2-{matrix.stem}", default_out)


@pytest.mark.parametrize("args, matrix, message", [
    (["nope"], None, "no matrix 'nope': not a file, nor scripts/matrices/nope.tsv; use one of: "),
    (["cpu-smoke", "--rows", "zz"], None, "--rows: no row 'zz' in scripts/matrices/cpu-smoke.tsv"),
    (["cpu-smoke", "--repeat", "0"], None, "--repeat '0': use a count >= 1"),
    (["cpu-smoke", "--frobnicate"], None, "unknown option '--frobnicate'"),
    (["cpu-smoke", "--out"], None, "--out needs a value"),
    ([], "# t\nx\t1\tdp_train\t-\t-\n", "m.tsv:2: expected 6 tab-separated fields"),
    ([], "# t\nx\t1\tdp_train\t\t-\t-\n", "m.tsv:2: expected 6 tab-separated fields"),
    ([], "# t\nx\t0\tdp_train\t-\t-\t-\n", "m.tsv:2: ranks '0' of row 'x': use a count >= 1"),
    ([], "# t\nx\t1\tfoo\t-\t-\t-\n", "m.tsv:2: program 'foo' of row 'x': use one of"),
    ([], "# t\nx\t1\tdp_train\tcompile:16x1024\t-\t-\n", "m.tsv:2: anchor 'compile:16x1024' of row 'x'"),
    ([], "# t\nx\t1\tdp_train\t-\ty\t-\n", "m.tsv:2: base 'y' of row 'x' is not a row of this matrix"),
    ([], "# t\nx\t1\tdp_train\t-\t-\t-\nx\t1\tdp_train\t-\t-\t-\n", "m.tsv:3: row 'x' is already defined"),
    ([], "# t\n# steps: ten\nx\t1\tdp_train\t-\t-\t-\n", "m.tsv:2: '# steps: ten': use a whole number"),
    ([], "# t\n# steps: 4\n# warmup: 4\nx\t1\tdp_train\t-\t-\t-\n", "'# warmup: 4' drops every one of '# steps: 4'"),
    ([], "# t\n", "m.tsv: no rows"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, matrix, message):
    if matrix is not None:
        (tmp_path / "m.tsv").write_text(matrix)
        args = [tmp_path / "m.tsv", "--dry-run"]
    r = bench(*args, "--dry-run") if matrix is None else bench(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.splitlines()) == 1 and message in r.stderr, r.stderr


def test_a_program_that_is_not_built_is_refused(tmp_path):
    r = bench("cpu-smoke", "--bin", tmp_path, "--out", tmp_path / "o")
    assert r.returncode == 2
    assert r.stderr.strip() == (f"benchmark: {tmp_path}/dp_train (row 'dp-np1') is not built: build it "
                                "(scripts/test) or pass --bin DIR (or set GPT2P_BIN)")


def built_programs():
    b = Path(os.environ.get("GPT2P_BIN") or ROOT / "build")
    have = all((b / p).is_file() and os.access(b / p, os.X_OK) for p in ("dp_train", "prepare_data"))
    data = (ROOT / ".cache" / "data" / "ding-gpt2.h5").exists() or (b / "prepare_data").exists()
    return b if have and data and shutil.which("mpirun") else None


@pytest.mark.skipif(built_programs() is None, reason="dp_train is not built (set GPT2P_BIN or build build/)")
def test_a_real_run_writes_the_table_and_readme(tmp_path):
    out = tmp_path / "o"
    r = bench("cpu-smoke", "--rows", "dp-np1 dp-np2 refused", "--repeat", "2", "--out", out,
              "--bin", built_programs(), timeout=300, GPT2P_GIT_COMMIT="0123456789ab")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((out / "table.json").read_text())
    rows = {x["name"]: x for x in doc["rows"]}
    assert list(rows) == ["dp-np1", "dp-np2", "refused"] and doc["repeat"] == 2 and doc["warmup_steps"] == 2
    for name in ("dp-np1", "dp-np2"):
        row = rows[name]
        assert row["status"] == "ok" and [x["rep"] for x in row["reps"]] == [1, 2]
        assert row["tok_s"] > 0 and row["step_s"] > 0 and row["steps_measured"] == 2 * (6 - 2)
        for rep in (1, 2):
            assert (out / "runs" / name / f"rep{rep}" / "rank0.h5").exists()
            assert (out / "logs" / f"{name}.rep{rep}.log").read_text().startswith("+ ")
    assert (out / "runs" / "dp-np2" / "rep1" / "rank1.h5").exists()
    assert rows["dp-np2"]["vs_base"] == pytest.approx(rows["dp-np2"]["tok_s"] / rows["dp-np1"]["tok_s"])
    assert rows["refused"]["status"] == "ok (rc 2, as expected)"
    assert doc["commit"] == "0123456789ab" and doc["command"].startswith("scripts/benchmark cpu-smoke --rows ")
    readme = (out / "README.md").read_text()
    for part in ("# CPU smoke:", "- Machine: CPU: ", "- Commit: 0123456789ab", "- Date: 20",
                 "`scripts/matrices/cpu-smoke.tsv`", "3 rows, 2 repetitions", "scripts/benchmark cpu-smoke",
                 "| row | np | tok/s (all ranks) | step |", "| dp-np2 | 2 |"):
        assert part in readme, part
    assert (out / "table.txt").read_text() in r.stdout
    assert (out / "matrix.tsv").read_text() == (ROOT / "scripts" / "matrices" / "cpu-smoke.tsv").read_text()


@pytest.mark.skipif(built_programs() is None, reason="dp_train is not built (set GPT2P_BIN or build build/)")
def test_a_real_run_beside_an_anchor(tmp_path):
    """An anchor script's JSON line reaches the table: a stand-in compile_anchor.py (the real one
    needs a GPU) that reports 100 tokens/s per rank of WORLD, and a failing one."""
    anchors = tmp_path / "anchors"
    anchors.mkdir()
    (anchors / "compile_anchor.py").write_text(
        "import json, os\n"
        "if os.environ['CONFIGS'] == '4x32xbf16':\n"
        "    raise SystemExit('no GPU here')\n"
        "print('compiling...')\n"
        "print(json.dumps({'anchor': 'stand-in', 'config': os.environ['CONFIGS'], 'TF32': os.environ['TF32'],\n"
        "                  'tok_s': 100 * int(os.environ['WORLD']), 'mem_gib': 0.5}))\n")
    m = tmp_path / "m.tsv"
    m.write_text("# One tiny row beside a stand-in anchor\n# steps: 4\n# warmup: 1\n# repeat: 2\n" + "".join(
        "\t".join(r) + "\n" for r in (
            ("tiny", "1", "dp_train", "compile:8x32xfp32+tf32", "-", "--device cpu --preset tiny --batch-size 8 --seq-len 32"),
            ("tiny-bf16", "1", "dp_train", "compile:4x32xbf16", "tiny", "--device cpu --preset tiny --batch-size 4 --seq-len 32"))))
    out = tmp_path / "o"
    r = bench(m, "--out", out, "--bin", built_programs(), timeout=300, GPT2P_ANCHORS=str(anchors))
    assert r.returncode == 1, r.stdout + r.stderr  # the bf16 anchor failed
    assert "not as expected: tiny-bf16 compile-4x32xbf16-w1" in r.stderr
    rows = {x["name"]: x for x in json.loads((out / "table.json").read_text())["rows"]}
    assert rows["tiny"]["anchor_tok_s"] == 100 and rows["tiny"]["anchor_gib"] == 0.5
    assert rows["tiny"]["vs_anchor"] == pytest.approx(rows["tiny"]["tok_s"] / 100)
    assert [x["anchor"]["TF32"] for x in rows["tiny"]["reps"]] == ["1", "1"]
    assert rows["tiny-bf16"]["status"].startswith("failed: no line of anchor compile:4x32xbf16")
    assert (out / "anchors" / "compile-8x32xfp32+tf32-w1.rep2.jsonl").exists()
    assert "no GPU here" in (out / "anchors" / "compile-4x32xbf16-w1.rep1.err").read_text()
    readme = (out / "README.md").read_text()
    assert "## Anchors" in readme and "CONFIGS=8x32xfp32 TF32=1 WORLD=1" in readme and "rep 2: rc 0" in readme
