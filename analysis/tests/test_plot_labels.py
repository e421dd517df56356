"""The plots label numbers the way a reader reads them (analysis/numbers.py): HW5's bars say
"107.7k tok/s" and "8.56 s", tokens/s axes tick "100k", titles say "1.95×"; never 1.077e+05."""

import re

import matplotlib.pyplot as plt

from analysis import plots, summary
from analysis.reader import read_run


SCIENTIFIC = re.compile(r"\de[+-]?\d|^1e\d")


def texts_of(fig):
    fig.canvas.draw()
    out = [t.get_text() for ax in fig.axes for t in ax.texts]
    out += [t.get_text() for ax in fig.axes for t in ax.get_yticklabels() + ax.get_xticklabels()]
    out += [ax.get_title() for ax in fig.axes] + [ax.yaxis.get_offset_text().get_text() for ax in fig.axes]
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
    assert any(t.endswith(" tok/s\n± " + t.split("± ")[-1]) and "tok/s" in t for t in tok)
    assert any(t.split("\n")[0].endswith(" s") for t in time)
    ratio = f"{s['data_parallel']['speedup_throughput_x']:.2f}× throughput"
    assert any(ratio in t for t in tok)
    for texts in seen.values():
        assert not any(SCIENTIFIC.search(t) for t in texts), texts


def test_sweep_axes_tick_tokens(tmp_path, monkeypatch):
    seen = capture(monkeypatch)
    pts = [{"program": "dp_train", "world_size": w, "tok_mean": 53_000.0 * w, "tok_std": 100.0} for w in (1, 2)]
    plots.world_size_plot(pts, tmp_path / "w.png")
    ticks = [t for t in seen["w.png"] if t.endswith("k")]
    assert ticks and not any(SCIENTIFIC.search(t) for t in seen["w.png"])
