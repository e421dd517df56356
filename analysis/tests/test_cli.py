"""summarize, timeline and sweep end to end on the fixtures."""

import json

import pytest

from analysis.__main__ import main
from conftest import load_json


def test_summarize_in_scripts_run_form_with_pp_dir_absent(fixtures, tmp_path, capsys):
    # scripts/run: python3 -m analysis summarize <runs/dp> <runs/pp> --out <runs/analysis>
    out = tmp_path / "analysis"
    assert main(["summarize", str(fixtures / "dp2"), str(tmp_path / "pp"), "--out", str(out)]) == 0
    assert "pp: does not exist, skipped" in capsys.readouterr().err
    m = load_json(out / "dp2" / "metrics.json")
    assert m["program"] == "dp_train" and m["world_size"] == 2
    assert {"time_mean", "time_std", "tok_mean", "tok_std"} <= set(m["performance"])
    assert m["performance"]["tokens_per_sec_definition"].startswith("HW5's tokens/s: the sum over ranks")
    assert {"tok_s_mean", "tok_s_std", "tok_s_definition", "label"} <= set(m["throughput"])
    assert m["throughput"]["tok_s_definition"].startswith("tokens/s: all ranks' padded tokens")
    assert m["throughput"]["label"] == "tok/s (all ranks, padded), mean ± std of the epochs after warm-up"
    assert len(m["step_breakdown"]) == 2
    for f in ("dp2/step_breakdown.png", "dp2/loss.png", "loss_curves.png", "summary.json"):
        assert (out / f).stat().st_size > 1000


def test_summarize_pipeline_run_adds_bubble_and_timeline(fixtures, tmp_path):
    assert main(["summarize", str(fixtures / "dp2"), str(fixtures / "pp_1f1b_m4"), "--out", str(tmp_path)]) == 0
    m = load_json(tmp_path / "pp_1f1b_m4" / "metrics.json")
    assert m["pipeline_bubble"]["microbatches"] == 4
    assert (tmp_path / "pp_1f1b_m4" / "pipeline_timeline.png").stat().st_size > 10_000
    assert len(load_json(tmp_path / "summary.json")["runs"]) == 2


def test_summarize_nothing_existing_is_an_error(tmp_path, capsys):
    assert main(["summarize", str(tmp_path / "a"), "--out", str(tmp_path / "o")]) == 1
    assert "none of the given run directories exists" in capsys.readouterr().err


def test_timeline_trace_is_valid_chrome_json(fixtures, tmp_path):
    assert main(["timeline", str(fixtures / "pp_1f1b_m4"), "--out", str(tmp_path)]) == 0
    trace = json.loads((tmp_path / "pipeline_trace.json").read_text())
    events = trace["traceEvents"]
    x = [e for e in events if e["ph"] == "X"]
    assert x and all({"name", "ph", "pid", "tid", "ts", "dur"} <= set(e) for e in x)
    assert {e["pid"] for e in x} == {0, 1}
    assert all(e["dur"] >= 0 for e in x)
    fwd = [e for e in x if e["cat"] == "forward"]
    steps = {e["args"]["step"] for e in x}
    # every step runs every micro-batch forward on every stage
    assert len(fwd) == len(steps) * 4 * 2
    assert {e["args"]["microbatch"] for e in fwd} == {0, 1, 2, 3}
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}
    assert (tmp_path / "pipeline_timeline.png").stat().st_size > 10_000


def test_timeline_errors_name_the_fix(fixtures, tmp_path, capsys):
    assert main(["timeline", str(fixtures / "dp2"), "--out", str(tmp_path)]) == 1
    assert "no /actions rows; timelines need a pp_train run" in capsys.readouterr().err
    assert main(["timeline", str(fixtures / "pp_1f1b_m4"), "--out", str(tmp_path), "--step", "9999"]) == 1
    assert "step 9999 has no actions" in capsys.readouterr().err


def test_sweep_world_size_and_microbatches(fixtures, tmp_path):
    assert main(["sweep", str(fixtures / "dp1"), str(fixtures / "dp2"), str(fixtures / "pp_mp"),
                 str(fixtures / "pp_1f1b_m4"), "--out", str(tmp_path)]) == 0
    s = load_json(tmp_path / "sweep.json")
    assert sorted(p["world_size"] for p in s["world_size"]) == [1, 2]
    assert sorted(p["microbatches"] for p in s["microbatches"]) == [1, 4]
    pipe = [p for p in s["microbatches"] if p["mode"] == "pipeline"][0]
    assert pipe["bubble_ideal"] == pytest.approx(0.2)
    for f in ("throughput_vs_world_size.png", "throughput_vs_microbatches.png"):
        assert (tmp_path / f).stat().st_size > 10_000


def test_interleaved_run_timeline_has_one_row_per_rank_and_the_stage_in_every_event(fixtures, tmp_path):
    # pp_train --schedule interleaved --stages-per-rank 2 --microbatches 4 on 2 ranks: stages 0, 2
    # on rank 0 and 1, 3 on rank 1.
    assert main(["timeline", str(fixtures / "pp_interleaved_m4"), "--out", str(tmp_path)]) == 0
    events = json.loads((tmp_path / "pipeline_trace.json").read_text())["traceEvents"]
    x = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in x} == {0, 1}
    fwd = [e for e in x if e["cat"] == "forward"]
    assert {(e["pid"], e["args"]["stage"]) for e in fwd} == {(0, 0), (0, 2), (1, 1), (1, 3)}
    assert all(e["name"].endswith(f"@{e['args']['stage']}") for e in fwd)
    steps = {e["args"]["step"] for e in x}
    assert len(fwd) == len(steps) * 4 * 4  # 4 micro-batches on each of the 4 stages
    assert (tmp_path / "pipeline_timeline.png").stat().st_size > 10_000


def test_interleaved_run_is_named_with_its_stages_per_rank_and_its_ideal_bubble(fixtures, tmp_path):
    assert main(["sweep", str(fixtures / "pp_interleaved_m4"), str(fixtures / "pp_1f1b_m4"),
                 "--out", str(tmp_path)]) == 0
    pts = {p["schedule"]: p for p in load_json(tmp_path / "sweep.json")["microbatches"]}
    assert set(pts) == {"interleaved x2", "1f1b"}
    # (n - 1) / (V M + n - 1) = 1 / 9 against 1F1B's 1 / 5 at the same M
    assert pts["interleaved x2"]["bubble_ideal"] == pytest.approx(1 / 9)
    assert pts["1f1b"]["bubble_ideal"] == pytest.approx(0.2)


def test_interleaved_bubble_counts_ranks_and_stages(fixtures):
    from analysis import metrics
    from analysis.reader import read_run
    b = metrics.bubble(read_run(fixtures / "pp_interleaved_m4"))
    assert (b["ranks"], b["stages"], b["stages_per_rank"], b["microbatches"]) == (2, 4, 2, 4)
    assert b["ideal"] == pytest.approx(1 / 9)
    assert 0.0 <= b["measured"] < 1.0


def test_summarize_prints_the_definition_and_readable_spreads(fixtures, tmp_path, capsys):
    assert main(["summarize", str(fixtures / "dp1"), str(fixtures / "dp2"), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    flat = " ".join(line.lstrip("# ") for line in out.splitlines() if line.startswith("#"))
    assert "tokens/s: all ranks' padded tokens (batch x seq_len on every data-parallel rank; a pipeline's" in flat
    head = next(line for line in out.splitlines() if line.startswith("# run"))
    assert "tok/s (all ranks, padded)" in head and "time/epoch s" in head
    m = load_json(tmp_path / "dp1" / "metrics.json")["throughput"]
    row = next(line for line in out.splitlines() if line.startswith("  dp1 "))
    assert f"{m['tok_s_mean']:.1f} ± {m['tok_s_std']:.1f}" in row and "2 +1 warm-up" in row, row
    assert "e+" not in out and "±0" not in out


def test_one_epoch_after_warmup_says_n_1(fixtures, tmp_path, capsys):
    # 3 epochs, 2 of them warm-up: one sample, no spread to show.
    assert main(["summarize", str(fixtures / "dp1"), "--out", str(tmp_path), "--warmup-epochs", "2"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("  dp1 "))
    assert "(n=1)" in row and "±" not in row, row
