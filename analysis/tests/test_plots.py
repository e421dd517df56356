import pytest

from analysis import plots, timeline
from analysis.reader import read_run


@pytest.mark.parametrize("name", ["dp1", "dp2", "pp_1f1b_m4"])
def test_step_breakdown_and_loss_plots(fixtures, tmp_path, name):
    run = read_run(fixtures / name)
    a = plots.step_breakdown_plot(run, tmp_path / "b.png")
    b = plots.loss_plot([run], tmp_path / "l.png")
    for p in (a, b):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
    assert not list(tmp_path.glob("*.tmp.png"))


def test_gantt_of_a_chosen_step(fixtures, tmp_path):
    run = read_run(fixtures / "pp_1f1b_m4")
    assert timeline.pick_step(run) == int(run.ranks[0].table("steps")["step"][
        run.ranks[0].table("steps")["epoch"] >= 1][0])
    p = timeline.gantt(run, tmp_path / "g.png", step=0)
    assert p.stat().st_size > 10_000


def test_microbatch_plot_without_model_parallel_baseline(tmp_path):
    pts = [{"mode": "pipeline", "schedule": "1f1b", "microbatches": m, "world_size": 2,
            "tok_s_mean": 100.0 * m / (m + 1), "tok_s_std": 1.0} for m in (2, 4, 8)]
    p = plots.microbatch_plot(pts, tmp_path / "m.png")
    assert p.stat().st_size > 10_000


def test_sweep_draws_pp_plan_predictions_for_the_runs_partition(fixtures, tmp_path):
    from analysis.__main__ import main
    out = tmp_path / "sweep"
    assert main(["sweep", str(fixtures / "pp_mp"), str(fixtures / "pp_1f1b_m4"), "--out", str(out),
                 "--plan", str(fixtures / "plan.json")]) == 0
    import json
    sweep = json.loads((out / "sweep.json").read_text())
    # The fixture runs use --partition balanced; the plan (pp_plan on the same tiny model, batch 16 x
    # 16, M 2 and 4) predicts both schedules for it.
    pred = sweep["predicted"]
    assert {(p["schedule"], p["microbatches"]) for p in pred} == {
        ("gpipe", 2), ("gpipe", 4), ("1f1b", 2), ("1f1b", 4)}
    assert all(p["split"] == "0-2|3-3" and p["tok_s"] > p["model_parallel_tok_s"] > 0 for p in pred)
    assert (out / "throughput_vs_microbatches.png").stat().st_size > 10_000


def test_sweep_rejects_a_plan_for_another_batch(fixtures, tmp_path, capsys):
    import json
    from analysis.__main__ import main
    plan = json.loads((fixtures / "plan.json").read_text())
    plan["batch_size"] = 64
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps(plan))
    assert main(["sweep", str(fixtures / "pp_1f1b_m4"), "--out", str(tmp_path / "s"),
                 "--plan", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "the plan is for batch 64 x 16 on 2 stages but the runs are batch 16 x 16" in err


def texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


@pytest.mark.parametrize("name", ["dp2", "pp_1f1b_m4"])
def test_step_breakdown_says_forward_holds_the_lm_heads_backward(fixtures, tmp_path, monkeypatch, name):
    seen = {}
    save = plots._save

    def keep(fig, path):
        seen["texts"] = texts(fig)
        return save(fig, path)
    monkeypatch.setattr(plots, "_save", keep)
    run = read_run(fixtures / name)
    plots.step_breakdown_plot(run, tmp_path / "b.png")
    caption = [" ".join(t.split()) for t in seen["texts"]]
    assert len(caption) == 1
    head = "The last stage's forward" if name.startswith("pp") else "Forward"
    assert caption[0].startswith(head + " includes the LM head's backward: its hidden-state and weight "
                                 "gradients are computed in the forward pass "
                                 "(include/gpt2p/model/lm_head_loss.h)"), caption
    sync = "tied embedding/LM-head gradient" if name.startswith("pp") else "gradient all-reduce"
    assert sync in caption[0] and "Exposed sync:" in caption[0]


def test_timeline_labels_the_gradient_sync_before_the_optimizer(fixtures):
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    run = read_run(fixtures / "pp_1f1b_m4")
    fig, ax = timeline.gantt_figure(run)
    # The fixture's ranks wait a few ms between their last action and the optimizer.
    boxes = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_gid() == "grad-sync"]
    assert len(boxes) == 2 and all(b.get_width() > 0 for b in boxes)
    labels = [t for t in ax.texts if t.get_gid() == "grad-sync-label"]
    assert [t.get_text() for t in labels] == ["grad sync"]
    legend = [t.get_text() for lg in [ax.get_legend()] + [a for a in ax.artists] for t in lg.get_texts()]
    assert any(" ".join(t.split()).startswith(
        "grad sync before the optimizer: the last sends, the tied embedding/LM-head gradient summed "
        "between the first and last stage; in /steps sync_exposed") for t in legend), legend
    assert "dotted: grad sync" in ax.get_title()
    plt.close(fig)
    trace = timeline.chrome_trace(run)
    sync = [e for e in trace["traceEvents"] if e.get("cat") == "gradient sync"]
    steps = {int(s) for s in run.ranks[0].table("steps")["step"]}
    assert len(sync) == 2 * len(steps) and all(e["dur"] > 0 and e["name"] == "grad sync" for e in sync)
