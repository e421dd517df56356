"""HW5's metric math, checked against a hand computation straight from the fixture files."""

import h5py
import numpy as np
import pytest

from analysis import metrics
from analysis.reader import read_run


def hand(run_dir, warmup, sum_over_ranks=True):
    files = sorted(run_dir.glob("rank*.h5*"))
    times, toks = [], []
    for p in files:
        with h5py.File(p, "r") as f:
            times.append(f["epochs/train_time"][...])
            toks.append(f["epochs/tokens_per_sec"][...])
    n = min(len(t) for t in times)
    t = np.mean([x[:n] for x in times], axis=0)[warmup:]
    k = np.array([x[:n] for x in toks])
    k = (k.sum(axis=0) if sum_over_ranks else k.mean(axis=0))[warmup:]
    return t.mean(), t.std(), k.mean(), k.std()


@pytest.mark.parametrize("name,warmup", [("dp1", 1), ("dp2", 1), ("dp2", 0), ("dp1", 2)])
def test_dp_performance_matches_hand_computation(fixtures, name, warmup):
    perf = metrics.run_performance(read_run(fixtures / name), warmup)
    tm, ts, km, ks = hand(fixtures / name, warmup)
    assert perf["time_mean"] == pytest.approx(tm, rel=1e-12)
    assert perf["time_std"] == pytest.approx(ts, rel=1e-12, abs=1e-15)
    assert perf["tok_mean"] == pytest.approx(km, rel=1e-12)
    assert perf["tok_std"] == pytest.approx(ks, rel=1e-12, abs=1e-12)
    assert perf["warmup_epochs_dropped"] == warmup


def test_two_rank_throughput_is_the_sum_over_ranks(fixtures):
    t = metrics.epoch_table(read_run(fixtures / "dp2"))
    assert t["tok_r"].shape[1] == 2
    np.testing.assert_allclose(t["tok"], t["tok_r"][:, 0] + t["tok_r"][:, 1])
    np.testing.assert_allclose(t["time"], t["time_r"].mean(axis=1))


def test_pipeline_stages_are_one_replica(fixtures):
    # Every stage processes the whole batch: throughput is the mean over stages, not their sum.
    run = read_run(fixtures / "pp_1f1b_m4")
    perf = metrics.run_performance(run, 1)
    tm, ts, km, ks = hand(fixtures / "pp_1f1b_m4", 1, sum_over_ranks=False)
    assert perf["tok_mean"] == pytest.approx(km, rel=1e-12)
    assert perf["time_mean"] == pytest.approx(tm, rel=1e-12)


def test_default_warmup_comes_from_the_run_config(fixtures):
    run = read_run(fixtures / "dp1")
    assert metrics.warmup_of(run) == run.config["warmup_epochs"]
    assert metrics.run_performance(run)["epochs_used"] == list(
        range(run.config["warmup_epochs"], run.config["epochs"]))


def test_all_epochs_warmup_keeps_them_with_a_warning(fixtures, capsys):
    perf = metrics.run_performance(read_run(fixtures / "dp1"), 99)
    assert perf["warmup_epochs_dropped"] == 0
    assert len(perf["epochs_used"]) == 3
    assert "all 3 epoch(s) are warm-up" in capsys.readouterr().err


def test_speedups_follow_hw5_definitions():
    base = {"time_mean": 10.0, "tok_mean": 100.0}
    new = {"time_mean": 4.0, "tok_mean": 260.0}
    s = metrics.speedups(base, new)
    assert s["speedup_time_reduction_x"] == pytest.approx(2.5)
    assert s["speedup_throughput_x"] == pytest.approx(2.6)
    assert np.isnan(metrics.speedups(base, {"time_mean": 0.0, "tok_mean": 1.0})["speedup_time_reduction_x"])


def test_step_breakdown_sums_to_step_time(fixtures):
    run = read_run(fixtures / "dp2")
    rows = metrics.step_breakdown(run, 1)
    assert [r["rank"] for r in rows] == [0, 1]
    with h5py.File(fixtures / "dp2" / "rank1.h5", "r") as f:
        keep = f["steps/epoch"][...] >= 1
        assert rows[1]["forward"] == pytest.approx(f["steps/forward"][...][keep].mean())
        total = (f["steps/end"][...] - f["steps/start"][...])[keep].mean()
    phases = sum(rows[1][p] for p in metrics.PHASES)
    assert rows[1]["total"] == pytest.approx(total)
    assert rows[1]["other"] == pytest.approx(max(0.0, total - phases))


def test_bubble_of_a_pipeline_run(fixtures):
    b = metrics.bubble(read_run(fixtures / "pp_1f1b_m4"))
    assert b["stages"] == 2 and b["microbatches"] == 4
    assert b["ideal"] == pytest.approx(1 / 5)
    assert 0.0 <= b["measured"] < 1.0
    assert metrics.bubble(read_run(fixtures / "dp2")) is None
