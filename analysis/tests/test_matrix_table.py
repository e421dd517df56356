"""analysis/matrix_table.py on a benchmark output assembled from the committed fixtures, against a
hand computation from the HDF5 files; and analysis/numbers.py, the way numbers are written."""

import json
import shutil

import h5py
import numpy as np
import pytest

from analysis import matrix_table, numbers
from conftest import load_json

WARMUP = 2


def steps(path):
    with h5py.File(path, "r") as f:
        st = f["steps"]
        return (np.asarray(st["end"][:] - st["start"][:]), np.asarray(st["padded_tokens"][:], dtype=float))


def row(name, rep, ranks, program, rc=0, expect=0, anchor="-", key="-", base="-"):
    return "\t".join(map(str, (name, rep, ranks, program, anchor, key, base, expect, rc, "1.5", "-",
                               f"mpirun -np {ranks} {program}")))


@pytest.fixture
def bench(fixtures, tmp_path):
    """dp1 (two repetitions: the fixture twice) against a compile anchor, dp2 with dp1 as its base,
    pp_mp with the fixture plan as its base, pp_1f1b_m4 over pp_mp, a refused row and a plan row."""
    out = tmp_path / "out"
    for name, fixture, reps in (("dp1", "dp1", 2), ("dp2", "dp2", 1), ("mp", "pp_mp", 1),
                                ("1f1b", "pp_1f1b_m4", 1)):
        for r in range(1, reps + 1):
            shutil.copytree(fixtures / fixture, out / "runs" / name / f"rep{r}")
    (out / "runs" / "plan" / "rep1").mkdir(parents=True)
    shutil.copy(fixtures / "plan.json", out / "runs" / "plan" / "rep1" / "plan.json")
    (out / "anchors").mkdir()
    for r, tok in ((1, 1000.0), (2, 3000.0)):
        (out / "anchors" / f"compile-8x16xfp32-w1.rep{r}.jsonl").write_text(
            "not json\n" + json.dumps({"anchor": "nanogpt-compile", "tok_s": tok, "mem_gib": 1.5}) + "\n")
    lines = ["# " + "\t".join(matrix_table.ROW_FIELDS),
             row("dp1", 1, 1, "dp_train", anchor="compile:8x16xfp32", key="compile-8x16xfp32-w1"),
             row("dp1", 2, 1, "dp_train", anchor="compile:8x16xfp32", key="compile-8x16xfp32-w1"),
             row("dp2", 1, 2, "dp_train", base="dp1"),
             row("plan", 1, 1, "pp_plan"),
             row("mp", 1, 2, "pp_train", base="plan"),
             row("1f1b", 1, 2, "pp_train", base="mp"),
             row("refused", 1, 1, "dp_train", rc=2, expect=2),
             "\t".join(("big", "1", "4", "dp_train", "-", "-", "-", "0", "skip", "0", "a GPU per rank: needs 4, found 1", "-"))]
    (out / "rows.tsv").write_text("\n".join(lines) + "\n")
    (out / "anchors.tsv").write_text("# key\trep\trc\tseconds\tcommand\n" + "".join(
        f"compile-8x16xfp32-w1\t{r}\t0\t9.5\tCONFIGS=8x16xfp32 python3 compile_anchor.py\n" for r in (1, 2)))
    (out / "machine.txt").write_text("CPU: test, 2 cores, Linux\n")
    return out


def by_name(doc):
    return {r["name"]: r for r in doc["rows"]}


def test_rows_match_a_hand_computation(bench, fixtures):
    assert matrix_table.main([str(bench), "--warmup", str(WARMUP), "--command", "scripts/benchmark x",
                              "--commit", "abc123", "--date", "2026-12-02T00:00:00Z", "--title", "test"]) == 0
    rows = by_name(load_json(bench / "table.json"))
    # dp1: one rank; both repetitions (the same file twice) pooled after the warm-up steps.
    d, t = steps(fixtures / "dp1" / "rank0.h5")
    d, t = np.concatenate([d[WARMUP:]] * 2), np.concatenate([t[WARMUP:]] * 2)
    assert rows["dp1"]["tok_s"] == pytest.approx(np.median(t / d))
    assert rows["dp1"]["step_s"] == pytest.approx(np.median(d))
    assert rows["dp1"]["steps_measured"] == d.size
    assert rows["dp1"]["anchor_tok_s"] == 2000.0  # the median of the two repetitions' lines
    assert rows["dp1"]["vs_anchor"] == pytest.approx(rows["dp1"]["tok_s"] / 2000.0)
    # dp2: the slowest rank's step, both ranks' tokens (each rank is a replica).
    (d0, t0), (d1, t1) = (steps(fixtures / "dp2" / f"rank{r}.h5") for r in (0, 1))
    tok, dur = (t0 + t1)[WARMUP:], np.maximum(d0, d1)[WARMUP:]
    assert rows["dp2"]["tok_s"] == pytest.approx(np.median(tok / dur))
    assert rows["dp2"]["vs_base"] == pytest.approx(rows["dp2"]["tok_s"] / rows["dp1"]["tok_s"])
    # A pipeline's stages share one batch: its tokens are counted once.
    (d0, t0), (d1, t1) = (steps(fixtures / "pp_1f1b_m4" / f"rank{r}.h5") for r in (0, 1))
    tok, dur = np.maximum(t0, t1)[WARMUP:], np.maximum(d0, d1)[WARMUP:]
    assert rows["1f1b"]["tok_s"] == pytest.approx(np.median(tok / dur))
    assert rows["1f1b"]["vs_base"] == pytest.approx(rows["1f1b"]["tok_s"] / rows["mp"]["tok_s"])
    # mp over the plan: pp_plan's predicted model_parallel step (this plan has no row of its own
    # for it: a pipeline row's step times its speed-up over model_parallel) over the measured one.
    p = [p for p in load_json(fixtures / "plan.json")["predictions"] if p["partition"] == "balanced"][0]
    assert rows["mp"]["predicted_step_s"] == pytest.approx(p["step_s"] * p["speedup_vs_model_parallel"])
    assert rows["mp"]["vs_base"] == pytest.approx(rows["mp"]["predicted_step_s"] / rows["mp"]["step_s"])
    assert rows["refused"]["status"] == "ok (rc 2, as expected)" and "tok_s" not in rows["refused"]
    assert rows["big"]["status"] == "skipped: a GPU per rank: needs 4, found 1"
    assert rows["plan"]["status"].startswith("ok: ") and "fastest" in rows["plan"]["status"]
    assert all(np.isfinite(rows[n]["loss"]) for n in ("dp1", "dp2", "mp", "1f1b"))


def test_table_and_readme_are_written_for_readers(bench):
    assert matrix_table.main([str(bench), "--warmup", str(WARMUP), "--command", "scripts/benchmark cpu-smoke",
                              "--commit", "abc123", "--date", "2026-12-02T00:00:00Z", "--title", "A title",
                              "--matrix", "scripts/matrices/cpu-smoke.tsv"]) == 0
    text = (bench / "table.txt").read_text()
    head = text.splitlines()[0].split()
    assert head[:5] == ["row", "np", "tok/s", "(all", "ranks)"] and "MFU" not in head  # no column without a value
    assert "e+0" not in text and " ms" in text and "×" in text
    readme = (bench / "README.md").read_text()
    for part in ("# A title", "Machine: CPU: test, 2 cores, Linux", "Commit: abc123", "Date: 2026-12-02T00:00:00Z",
                 "scripts/benchmark cpu-smoke", "`scripts/matrices/cpu-smoke.tsv`", "| row | np | tok/s (all ranks) |",
                 "2 repetitions", "CONFIGS=8x16xfp32 python3 compile_anchor.py"):
        assert part in readme, part


def test_a_row_that_failed_fails_the_table(bench, capsys):
    rows = (bench / "rows.tsv").read_text().replace("dp2\t1\t2\tdp_train\t-\t-\tdp1\t0\t0", "dp2\t1\t2\tdp_train\t-\t-\tdp1\t0\t137")
    (bench / "rows.tsv").write_text(rows)
    assert matrix_table.main([str(bench), "--warmup", str(WARMUP)]) == 1
    doc = by_name(load_json(bench / "table.json"))
    assert doc["dp2"]["status"].startswith("failed: rep 1: rc 137 (want 0")
    assert "vs_base" not in doc["dp2"]
    assert "not as expected: dp2" in capsys.readouterr().err


def test_too_few_steps_and_a_missing_output_are_failures(bench):
    assert matrix_table.main([str(bench), "--warmup", "1000"]) == 1
    assert "none after the 1000 warm-up steps" in by_name(load_json(bench / "table.json"))["dp1"]["status"]
    assert matrix_table.main([str(bench / "nothing")]) == 2


def test_anchor_lines_are_picked_by_configuration():
    ddp = [{"mode": "single", "world": 1, "B": 64, "S": 128, "prec": "fp32", "tok_s": 1},
           {"mode": "naive", "world": 2, "B": 64, "S": 128, "prec": "fp32", "tok_s": 2},
           {"mode": "ddp", "world": 2, "B": 64, "S": 128, "prec": "fp32", "tok_s": 3},
           {"mode": "ddp", "world": 2, "B": 16, "S": 1024, "prec": "bf16", "tok_s": 4}]
    pick = matrix_table.anchor_line
    assert pick("ddp:64x128xfp32", 1, ddp)["tok_s"] == 1
    assert pick("ddp:64x128xfp32", 2, ddp)["tok_s"] == 3
    assert pick("ddp:64x128xfp32:naive", 2, ddp)["tok_s"] == 2
    assert pick("ddp:16x1024xbf16", 1, ddp) is None
    pp = [{"mode": "model_parallel", "B": 64, "S": 128, "prec": "fp32", "tok_s": 5},
          {"mode": "pipe_gpipe", "M": 4, "B": 64, "S": 128, "prec": "fp32", "tok_s": 6},
          {"mode": "pipe_onef1b", "M": 4, "B": 64, "S": 128, "prec": "fp32", "tok_s": 7},
          {"error": "onef1b", "M": 8, "codes": [1, 1]}]
    assert pick("pp:64x128xfp32:model_parallel", 2, pp)["tok_s"] == 5
    assert pick("pp:64x128xfp32:onef1b:4", 2, pp)["tok_s"] == 7
    assert pick("pp:64x128xfp32:onef1b:8", 2, pp) is None
    assert pick("comm", 2, [{"bf16_matmul_TFLOPs": 700}]) is None


@pytest.mark.parametrize("value, text", [
    (107667, "107.7k"), (535047.3, "535.0k"), (1_234_567, "1.2M"), (999_960, "1.0M"), (950, "950"), (75.8, "76"), (2.345, "2.35"),
    (0, "0"), (float("nan"), "-"), (None, "-")])
def test_count(value, text):
    assert numbers.count(value) == text


def test_units():
    assert numbers.tok_s(107667) == "107.7k tok/s"
    assert numbers.count(100000, trim=True) == "100k" and numbers.count(150000, trim=True) == "150k"
    assert numbers.ms(0.03162) == "31.6 ms" and numbers.ms(0.00035) == "0.35 ms" and numbers.ms(4e-6) == "4 µs"
    assert numbers.seconds(8.5604) == "8.56 s" and numbers.seconds(137.2) == "137 s"
    assert numbers.gib(7.5 * 2**30) == "7.5 GiB" and numbers.gib(35 * 2**20) == "35 MiB"
    assert numbers.gib(0) == "-"
    assert numbers.ratio(1.0849) == "1.085×" and numbers.ratio(1.9474, 2) == "1.95×"
    assert numbers.percent(0.435) == "43.5%"
    assert numbers.sig(0.000123456) == "0.000123" and numbers.sig(123456.0) == "123456"
    for f in (numbers.count, numbers.ms, numbers.seconds, numbers.sig):
        assert "e" not in f(1.077e5) and "e" not in f(3.2e-7)


def test_plan_predictions_for_a_run():
    """microbatch-cost.tsv: pp_train on one rank at M against pp_plan --stages 1 (whose M = 1 row
    is model_parallel); pp.tsv-like rows against a 2-stage plan by schedule, V and zero bubble."""
    one = {"stages": 1, "predictions": [
        {"schedule": "model_parallel", "microbatches": 1, "partition": "balanced", "step_s": 0.10, "speedup_vs_model_parallel": 1},
        {"schedule": "gpipe", "microbatches": 4, "partition": "balanced", "step_s": 0.12, "speedup_vs_model_parallel": 0.8}]}
    run = {"mode": "pipeline", "schedule": "1f1b", "microbatches": 1, "stages_per_rank": 1, "partition": "balanced"}
    assert matrix_table.plan_prediction(one, run) == 0.10
    assert matrix_table.plan_prediction(one, dict(run, microbatches=4)) == 0.12
    assert matrix_table.plan_prediction(one, dict(run, microbatches=8)) is None
    two = {"stages": 2, "predictions": [
        {"schedule": "1f1b", "microbatches": 4, "partition": "balanced", "step_s": 0.08, "speedup_vs_model_parallel": 1.5,
         "stages_per_rank": 1, "zero_bubble": False, "zb_extra_live": 0},
        {"schedule": "1f1b", "microbatches": 4, "partition": "balanced", "step_s": 0.07, "speedup_vs_model_parallel": 1.7,
         "stages_per_rank": 1, "zero_bubble": True, "zb_extra_live": 0},
        {"schedule": "interleaved", "microbatches": 4, "partition": "balanced", "step_s": 0.075,
         "speedup_vs_model_parallel": 1.6, "stages_per_rank": 2, "zero_bubble": False, "zb_extra_live": 0},
        {"schedule": "1f1b", "microbatches": 4, "partition": "uniform", "step_s": 0.09, "speedup_vs_model_parallel": 1.4,
         "stages_per_rank": 1, "zero_bubble": False, "zb_extra_live": 0}]}
    run = dict(run, microbatches=4)
    assert matrix_table.plan_prediction(two, run) == 0.08
    assert matrix_table.plan_prediction(two, dict(run, zero_bubble=True, zb_extra_live=0)) == 0.07
    assert matrix_table.plan_prediction(two, dict(run, zero_bubble=True, zb_extra_live=-1)) is None
    assert matrix_table.plan_prediction(two, dict(run, schedule="interleaved", stages_per_rank=2)) == 0.075
    assert matrix_table.plan_prediction(two, dict(run, partition="uniform")) == 0.09
    assert matrix_table.plan_prediction(two, dict(run, mode="model_parallel")) == pytest.approx(0.12)
    assert matrix_table.plan_prediction(two, dict(run, schedule="gpipe")) is None


@pytest.mark.parametrize("mean, spread, n, text", [
    (261.53, 3.14, None, "261.5 ± 3.1"),          # the spread's two significant digits decide
    (336.601, 42.0, 2, "337 ± 42"),
    (1500.0, 300.0, None, "1.50k ± 0.30k"),        # k for the mean and the spread alike
    (74648.278, 75.758, 2, "74.648k ± 0.076k"),
    (1_234_500.0, 2000.0, None, "1.2345M ± 0.0020M"),
    (8.559831, 0.008687, 2, "8.5598 ± 0.0087"),
    (0.5, 3.2, None, "0.5 ± 3.2"),
    (500.0, 300.0, None, "500 ± 300"),
    (336.6, 0.0, 2, "336.6 ± 0.0"),               # no spread over 2 epochs: 0 at the mean's digits
    (1.521, 1.2e-6, None, "1.52100 ± 0.00000"),   # the mean keeps at most 6 significant digits
    (336.6, 0.0, 1, "336.6 (n=1)"),               # one sample has no spread
    (74648.3, 0.0, 1, "74.65k (n=1)"),
    (336.6, float("nan"), None, "336.6"),
    (float("nan"), 1.0, 2, "-"),
])
def test_mean_pm(mean, spread, n, text):
    assert numbers.mean_pm(mean, spread, n) == text


def test_mean_pm_never_writes_scientific_notation_or_a_bare_zero_spread():
    for mean in (3e-5, 0.0123, 1.5, 261.453, 9999.6, 1.077e5, 3.3e7, 4e9):
        for spread in (0.0, 1e-9, 0.003 * mean, 0.4 * mean, 3 * mean):
            text = numbers.mean_pm(mean, spread, 3)
            value, sd = text.split(" ± ")
            assert "e" not in text and sd != "0" or mean == 0, text
            # value and spread to the same decimal place, in the same unit
            assert len(value.rstrip("kMGT").partition(".")[2]) == len(sd.rstrip("kMGT").partition(".")[2]), text
            assert value[-1].isdigit() == sd[-1].isdigit(), text
    assert numbers.mean_pm(8.559831, 0.008687, suffix=False) == "8.5598 ± 0.0087"
    assert numbers.mean_pm(1500.0, 300.0, suffix=False) == "1500 ± 300"
    assert numbers.pm_parts(261.53, 3.14) == ("261.5", "3.1")
    assert numbers.pm_parts(261.53, 3.14, n=1) == ("261.5", None)


def test_tok_s_column_says_what_it_counts(bench):
    assert matrix_table.main([str(bench), "--warmup", str(WARMUP)]) == 0
    text = (bench / "table.txt").read_text()
    assert text.splitlines()[0].split()[:5] == ["row", "np", "tok/s", "(all", "ranks)"]
    note = " ".join(text.split("\n\n", 1)[1].split())
    assert note.startswith("tok/s (all ranks): all ranks' padded tokens (batch x seq_len on every "
                           "data-parallel rank; a pipeline's batch counted once per replica, not once "
                           "per stage) per second of the step's time (the slowest rank's); the median "
                           f"over every repetition's steps after the first {WARMUP}."), note
    assert load_json(bench / "table.json")["tok_s_definition"] == matrix_table.tok_s_note(WARMUP)
    assert matrix_table.tok_s_note(WARMUP) in (bench / "README.md").read_text()
