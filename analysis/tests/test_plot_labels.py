"""The plots label numbers the way a reader reads them (analysis/numbers.py): HW5's bars say
"107.667k ± 0.042k tok/s" and "8.5598 ± 0.0087 s", tokens/s axes tick "100k", titles say "1.95×";
never 1.077e+05. Their axes say which tokens/s they show: HW5's on HW5's plots, the analysis's
(all ranks, padded) on the sweeps."""

import re

import matplotlib.pyplot as plt

from analysis import metrics, numbers, plots, summary
from analysis.reader import read_run


SCIENTIFIC = re.compile(r"\de[+-]?\d|^1e\d")


def texts_of(fig):
    fig.canvas.draw()
    out = [t.get_text() for ax in fig.axes for t in ax.texts]
    out += [t.get_text() for ax in fig.axes for t in ax.get_yticklabels() + ax.get_xticklabels()]
    out += [ax.get_title() for ax in fig.axes] + [ax.yaxis.get_offset_text().get_text() for ax in fig.axes]
    out += [ax.get_ylabel() for ax in fig.axes]
    return out


def capture(monkeypatch):
    seen = {}
    save = plots._save

    def keep(fig, path):
        seen[path.name] = texts_of(fig)
        return save(fig, path)
    monkeypatch.setattr(plots, "_save", keep)
    return seen


def test_tokens_axis_ticks():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 160_000])
    plots.tokens_axis(ax.yaxis)
    labels = [t for t in texts_of(fig) if t]
    plt.close(fig)
    assert "100k" in labels and "20k" in labels, labels
    assert not any(SCIENTIFIC.search(t) for t in labels)


def test_hw5_bars_say_units_and_ratios(fixtures, tmp_path, monkeypatch):
    seen = capture(monkeypatch)
    runs = {k: read_run(fixtures / d) for k, d in (("dp_single", "dp1"), ("dp_multi", "dp2"),
                                                   ("pp_model", "pp_mp"), ("pp_pipeline", "pp_1f1b_m4"))}
    s = summary.hw5_summary(runs["dp_single"], runs["dp_multi"], runs["pp_model"], runs["pp_pipeline"])
    plots.hw5_plots(s, tmp_path, runs)
    tok, time = seen["ddp_tokens_per_second.png"], seen["ddp_training_time.png"]
    # Each bar: mean ± std to the same decimal place, then the unit.
    for run in ("single_gpu", "two_gpu"):
        v = s["data_parallel"][run]
        assert numbers.mean_pm(v["tok_mean"], v["tok_std"]) + " tok/s" in tok, tok
        assert numbers.mean_pm(v["time_mean"], v["time_std"], suffix=False) + " s" in time, time
    assert not any("±0" in t or "± 0\n" in t for t in tok + time)
    # The axes say the numbers are HW5's, and which HW5 definition.
    assert plots.HW5_TOK_DP_AXIS in tok and plots.HW5_TOK_PP_AXIS in seen["pp_tokens_per_second.png"]
    assert plots.HW5_TIME_AXIS in time
    ratio = f"{s['data_parallel']['speedup_throughput_x']:.2f}× throughput"
    assert any(ratio in t for t in tok)
    for texts in seen.values():
        assert not any(SCIENTIFIC.search(t) for t in texts), texts


def test_sweep_axes_tick_tokens(tmp_path, monkeypatch):
    seen = capture(monkeypatch)
    pts = [{"program": "dp_train", "world_size": w, "tok_s_mean": 53_000.0 * w, "tok_s_std": 100.0} for w in (1, 2)]
    plots.world_size_plot(pts, tmp_path / "w.png")
    ticks = [t for t in seen["w.png"] if t.endswith("k")]
    assert ticks and not any(SCIENTIFIC.search(t) for t in seen["w.png"])
    # The analysis's tokens/s, said so on the axis.
    assert "tok/s (all ranks, padded)\nmean ± std of the epochs after warm-up" in seen["w.png"]
    assert plots.TOK_S_AXIS.startswith(metrics.TOK_S_LABEL)
