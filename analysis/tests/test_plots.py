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
            "tok_mean": 100.0 * m / (m + 1), "tok_std": 1.0} for m in (2, 4, 8)]
    p = plots.microbatch_plot(pts, tmp_path / "m.png")
    assert p.stat().st_size > 10_000
