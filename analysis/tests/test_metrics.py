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


def hand_tok_s(run_dir, warmup, pipeline):
    """The analysis's tokens/s by hand: per epoch all ranks' padded tokens (a pipeline's batch
    once: its stages' largest count) over the mean of the ranks' train_time; mean, std after
    warm-up."""
    tokens, times = [], []
    for p in sorted(run_dir.glob("rank*.h5")):
        with h5py.File(p, "r") as f:
            tokens.append(np.asarray(f["epochs/padded_tokens"][...], dtype=float))
            times.append(np.asarray(f["epochs/train_time"][...], dtype=float))
    n = min(len(t) for t in tokens)
    tok = np.array([t[:n] for t in tokens])
    per_epoch = (tok.max(axis=0) if pipeline else tok.sum(axis=0)) / np.array([t[:n] for t in times]).mean(axis=0)
    return per_epoch, float(np.mean(per_epoch[warmup:])), float(np.std(per_epoch[warmup:]))


@pytest.mark.parametrize("name, pipeline", [("dp1", False), ("dp2", False), ("pp_1f1b_m4", True),
                                            ("pp_mp", True)])
def test_tokens_per_second_is_all_ranks_padded_tokens_over_the_epoch_time(fixtures, name, pipeline):
    run = read_run(fixtures / name)
    t = metrics.throughput(run, 1)
    per_epoch, mean, std = hand_tok_s(fixtures / name, 1, pipeline)
    np.testing.assert_allclose(t["tok_s_per_epoch"], per_epoch, rtol=1e-12)
    assert t["tok_s_mean"] == pytest.approx(mean, rel=1e-12)
    assert t["tok_s_std"] == pytest.approx(std, rel=1e-12, abs=1e-12)
    assert t["epochs_used"] == metrics.run_performance(run, 1)["epochs_used"]
    assert t["tok_s_definition"] == metrics.TOK_S_DEFINITION
    # A pipeline's batch is counted once, not once per stage: 2 stages of 512 tokens are 512.
    if pipeline:
        assert t["tokens_per_epoch"] == [512.0] * 3
    # HW5's figure sums per-rank rates (or averages stages): close to ours, not the same formula.
    assert t["tok_s_mean"] == pytest.approx(metrics.run_performance(run, 1)["tok_mean"], rel=0.01)


def test_the_definitions_say_what_is_counted():
    assert metrics.TOK_S_DEFINITION.startswith(
        "tokens/s: all ranks' padded tokens (batch x seq_len on every data-parallel rank; a pipeline's "
        "batch counted once per replica, not once per stage) per second of training time")
    assert "warm-up" in metrics.TOK_S_DEFINITION
    assert metrics.HW5_TOK_DP_DEFINITION.startswith("HW5's") and metrics.HW5_TOK_PP_DEFINITION.startswith("HW5's")
