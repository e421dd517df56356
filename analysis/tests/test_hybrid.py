"""pp_train --dp D runs (D data-parallel replicas of one P-rank pipeline) on the synthetic 2 x 2
run of conftest.write_pipeline_run, against hand computations from its schedule."""

import json
import shutil

import h5py
import matplotlib.pyplot as plt
import pytest

from analysis import matrix_table, metrics, summary, timeline
from analysis.__main__ import main
from analysis.reader import RunError, read_run

from conftest import write_pipeline_run

ROWS = ["replica 0, rank 0", "replica 0, rank 1", "replica 1, rank 0", "replica 1, rank 1"]


def test_dp_and_pp_of_a_hybrid_run(hybrid_2x2):
    run = read_run(hybrid_2x2)
    assert (run.dp, run.pp, run.world_size) == (2, 2, 4) and run.hybrid
    assert [(r.rank, r.dp_rank, r.pp_rank) for r in run.ranks] == [
        (0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert [r.rank for r in run.replica_ranks(1)] == [2, 3]
    assert run.label() == "pp_train 1f1b M=2 2 x 2 hybrid"


def test_files_without_the_attributes_are_one_pipeline_of_the_world(fixtures, tmp_path):
    run = read_run(fixtures / "pp_1f1b_m4")
    assert (run.dp, run.pp, run.hybrid) == (1, run.world_size, False) and run.pp == 2
    assert [(r.dp_rank, r.pp_rank) for r in run.ranks] == [(0, 0), (0, 1)]
    assert run.label() == "pp_train 1f1b M=4 n=2"
    # Four ranks without dp/pp attributes: one 4-rank pipeline.
    old = read_run(write_pipeline_run(tmp_path / "old", hybrid_attrs=False))
    assert (old.dp, old.pp) == (1, 4)
    assert [(r.dp_rank, r.pp_rank) for r in old.ranks] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert "hybrid" not in old.label() and old.label().endswith("n=4")
    assert metrics.loss_rank(old).rank == 3


def test_rank_files_that_disagree_on_the_mesh_are_refused(hybrid_2x2):
    with h5py.File(hybrid_2x2 / "rank2.h5", "r+") as f:
        f.attrs["dp_rank"] = 0.0
    with pytest.raises(RunError, match="rank 2 says replica 0, pipeline rank 0, but with pp 2 it is "
                                       "replica 1, pipeline rank 0"):
        read_run(hybrid_2x2)
    with h5py.File(hybrid_2x2 / "rank2.h5", "r+") as f:
        f.attrs["dp_rank"] = 1.0
        f.attrs["pp"] = 4.0
    with pytest.raises(RunError, match="disagree on dp x pp"):
        read_run(hybrid_2x2)


def test_actions_carry_replica_and_pipeline_rank(hybrid_2x2):
    a = metrics.actions(read_run(hybrid_2x2))
    pairs = {(int(r), int(d), int(p)) for r, d, p in zip(a["rank"], a["replica"], a["pp_rank"])}
    assert pairs == {(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)}
    assert a["stage"].max() == 1  # stages are within a replica's pipeline
    # Every rank's clock is moved onto the loss rank's (rank 1): rank 0's first forward of step 1
    # starts 20 units (0.2 s) into rank 1's clock, which started 0.25 s later.
    first = (a["rank"] == 0) & (a["step"] == 1) & (a["op"] == 0) & (a["microbatch"] == 0)
    assert a["start"][first][0] == pytest.approx(0.2 + 0.25)
    same = (a["rank"] == 2) & (a["step"] == 1) & (a["op"] == 0) & (a["microbatch"] == 0)
    assert a["start"][same][0] == pytest.approx(0.2 + 0.25)


def test_bubble_uses_the_pipeline_ranks_and_averages_the_replicas(hybrid_2x2):
    b = metrics.bubble(read_run(hybrid_2x2))
    # P = 2 ranks, V = 1, M = 2: ideal (P-1)/(V M+P-1) = 1/3 (with the world's 4 ranks it would be 3/5).
    assert (b["replicas"], b["ranks"], b["stages"], b["stages_per_rank"], b["microbatches"]) == (2, 2, 2, 1, 2)
    assert b["ideal"] == pytest.approx(1 / 3)
    # Steps 1 and 2 (step 0 is dropped): 12 units of compute per replica over 2 ranks x its span;
    # replica 0 spans 9.5 units, replica 1 (slower optimizer) 11.
    r0, r1 = 1 - 12 / (2 * 9.5), 1 - 12 / (2 * 11)
    assert b["measured_per_replica"] == pytest.approx([r0, r1])
    assert b["measured"] == pytest.approx((r0 + r1) / 2)
    assert b["steps"] == 3


def test_loss_rank_is_the_last_stage_of_replica_0(hybrid_2x2):
    r = metrics.loss_rank(read_run(hybrid_2x2))
    assert (r.rank, r.dp_rank, r.pp_rank) == (1, 0, 1)
    assert metrics.losses(read_run(hybrid_2x2))["final_val_loss"] == pytest.approx(4.6)


def test_throughput_sums_the_replicas_and_averages_each_ones_stages(hybrid_2x2):
    run = read_run(hybrid_2x2)
    assert metrics.epoch_table(run)["tok"].tolist() == pytest.approx([320.0 + 300.0])
    # The benchmark table counts each replica's batch once: 2 x 64 tokens per step.
    steps = matrix_table.run_steps(hybrid_2x2, warmup=0)
    assert steps["tokens"].tolist() == [128.0, 128.0, 128.0]
    assert steps["loss"] == pytest.approx(5.0 - 0.25 * 2)


def test_gantt_has_one_row_per_world_rank_grouped_by_replica(hybrid_2x2, tmp_path):
    run = read_run(hybrid_2x2)
    fig, ax = timeline.gantt_figure(run, step=1)
    ticks = sorted(zip(ax.get_yticks(), [t.get_text() for t in ax.get_yticklabels()]), reverse=True)
    assert [name for _, name in ticks] == ROWS  # top to bottom
    ys = [y for y, _ in ticks]
    # Replica 0's rows and replica 1's are set apart: a wider gap, and a line between them.
    assert ys[1] - ys[2] > ys[0] - ys[1] == pytest.approx(ys[2] - ys[3])
    lines = [ln.get_ydata()[0] for ln in ax.lines]
    assert len(lines) == 1 and ys[2] < lines[0] < ys[1]
    # Every compute box lies on its rank's row: 4 F/B boxes per rank.
    row_of = {}
    for coll in ax.collections:
        (y0, y1) = coll.get_paths()[0].get_extents().intervaly
        if y1 - y0 > 0.5:  # compute boxes are 0.6 high, communication 0.18
            row = min(ys, key=lambda y: abs((y0 + 0.22) - y))
            row_of[row] = row_of.get(row, 0) + 1
    assert sorted(row_of) == sorted(ys) and set(row_of.values()) == {5}  # 4 F/B + the optimizer
    assert "2 x 2 hybrid" in ax.get_title() and "2 replicas x 2 pipeline ranks" in ax.get_title()
    assert not any(c.get_hatch() for c in ax.collections)
    plt.close(fig)
    p = timeline.gantt(run, tmp_path / "g.png", step=1)
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


def test_gantt_of_an_interleaved_hybrid_run_hatches_the_later_stages(tmp_path):
    run = read_run(write_pipeline_run(tmp_path / "run", stages_per_rank=2, microbatches=2))
    fig, ax = timeline.gantt_figure(run, step=1)
    names = [t.get_text() for t in ax.get_yticklabels()]
    assert sorted(names) == sorted(f"{row}: stages {p}, {p + 2}" for row in ROWS
                                   for p in [int(row[-1])])
    # Stages 2 and 3 (the later stage of each pipeline rank) are hatched: half of the 8 F/B boxes
    # of each rank.
    hatched = [c for c in ax.collections if c.get_hatch()]
    assert len(hatched) == 4 * 4
    plt.close(fig)
    b = metrics.bubble(run)
    assert (b["stages"], b["stages_per_rank"]) == (4, 2)
    assert b["ideal"] == pytest.approx(1 / (2 * 2 + 1))


def test_chrome_trace_names_each_rank_by_replica(hybrid_2x2):
    trace = timeline.chrome_trace(read_run(hybrid_2x2))
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {0: "replica 0 rank 0", 1: "replica 0 rank 1", 2: "replica 1 rank 0",
                     3: "replica 1 rank 1"}
    timed = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in timed} == {0, 1, 2, 3}
    assert all(e["args"]["replica"] == e["pid"] // 2 for e in timed)
    assert all("@" not in e["name"] for e in timed)  # one stage per rank
    assert trace["otherData"]["label"] == "pp_train 1f1b M=2 2 x 2 hybrid"


def test_summarize_and_timeline_of_a_hybrid_run(hybrid_2x2, tmp_path):
    out = tmp_path / "out"
    assert main(["summarize", str(hybrid_2x2), "--out", str(out)]) == 0
    m = json.loads((out / "hybrid_2x2" / "metrics.json").read_text())
    assert (m["dp"], m["pp"], m["world_size"]) == (2, 2, 4)
    assert [(r["rank"], r["dp_rank"], r["pp_rank"]) for r in m["ranks"]] == [
        (0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert m["pipeline_bubble"]["replicas"] == 2 and m["pipeline_bubble"]["ranks"] == 2
    assert [(r["replica"], r["pp_rank"]) for r in m["step_breakdown"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert (out / "hybrid_2x2" / "pipeline_timeline.png").stat().st_size > 10_000
    trace = json.loads((out / "hybrid_2x2" / "pipeline_trace.json").read_text())
    assert len([e for e in trace["traceEvents"] if e.get("name") == "process_name"]) == 4
    assert summary.run_summary(read_run(hybrid_2x2))["label"] == "pp_train 1f1b M=2 2 x 2 hybrid"


def test_sweep_marks_hybrid_points(hybrid_2x2, fixtures, tmp_path):
    shutil.copytree(fixtures / "pp_1f1b_m4", tmp_path / "pp")
    assert main(["sweep", str(hybrid_2x2), str(tmp_path / "pp"), "--out", str(tmp_path / "s")]) == 0
    pts = json.loads((tmp_path / "s" / "sweep.json").read_text())["microbatches"]
    hybrid = [p for p in pts if p["world_size"] == 4]
    assert len(hybrid) == 1 and (hybrid[0]["dp"], hybrid[0]["pp"]) == (2, 2)
    assert [p for p in pts if p["world_size"] == 2][0].keys().isdisjoint({"dp", "pp"})
