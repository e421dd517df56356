"""Runs whose ranks shared a GPU (two ranks with the same host and device, e.g. 2 ranks on a
machine with one GPU): found from the rank files' identity (host, device), and said in
performance_summary.json (top level and per section), in every other JSON made from them and in
every plot's title. CPU ranks on one host are not sharing a GPU."""

import json
import shutil

import h5py
import matplotlib.figure
import pytest

from analysis import plots, summary, timeline
from analysis.__main__ import main
from analysis.reader import SHARED_GPU_CAVEAT, read_run, shared_gpu_note
from conftest import load_json, write_pipeline_run, write_rank_file

NOTE = "2 ranks shared one GPU: timings are functional, not speed figures"
HW5_KEYS = {"config", "data_parallel", "pipeline_parallel"}
DP_KEYS = {"single_gpu", "two_gpu", "speedup_time_reduction_x", "speedup_throughput_x"}
PP_KEYS = {"model_parallel", "pipeline_parallel", "speedup_time_reduction_x", "speedup_throughput_x"}
SHARED_KEYS = {"ranks_share_gpu", "note"}
DEFINITION = {"tokens_per_sec_definition"}  # added beside HW5's keys: what its tok_mean is
HW5_RUNS = {"dp_single": "dp1", "dp_multi": "dp2", "pp_model": "pp_mp", "pp_pipeline": "pp_1f1b_m4"}


def write_dp_run(directory, identities, epochs=3, tokens_per_sec=1000.0):
    """A dp_train run with one rank per (host, device) in `identities`: 4 steps per epoch, the
    first epoch warm-up."""
    directory.mkdir(parents=True, exist_ok=True)
    world = len(identities)
    config = {"batch_size": 8 * world, "seq_len": 16, "epochs": epochs, "warmup_epochs": 1}
    for r, (host, device) in enumerate(identities):
        st = {c: [] for c in ("step", "epoch", "start", "end", "data", "forward", "backward",
                              "sync_exposed", "sync_total", "optimizer", "loss", "lr",
                              "padded_tokens", "target_tokens")}
        for k in range(4 * epochs):
            for c, x in (("step", k), ("epoch", k // 4), ("start", 0.1 * k), ("end", 0.1 * k + 0.09),
                         ("data", 0.01), ("forward", 0.02), ("backward", 0.04),
                         ("sync_exposed", 0.01 * (world > 1)), ("sync_total", 0.01 * (world > 1)),
                         ("optimizer", 0.005), ("loss", 5.0 - 0.1 * k), ("lr", 1e-4),
                         ("padded_tokens", 128.0), ("target_tokens", 120.0)):
                st[c].append(x)
        ep = {"epoch": list(range(epochs)), "train_time": [0.4 + 0.01 * e for e in range(epochs)],
              "tokens_per_sec": [tokens_per_sec + 10 * e for e in range(epochs)],
              "target_tokens_per_sec": [0.9 * tokens_per_sec] * epochs,
              "padded_tokens": [512.0] * epochs, "val_loss": [4.5 - 0.1 * e for e in range(epochs)],
              "val_ppl": [90.0] * epochs, "bleu": [0.0] * epochs, "peak_memory_bytes": [1e8] * epochs}
        attrs = {"program": "dp_train", "rank": r, "world_size": world, "config": json.dumps(config),
                 "host": host, "device": device,
                 "gpu_name": "NVIDIA H200" if device.startswith("cuda") else " "}
        write_rank_file(directory / f"rank{r}.h5", attrs, {"steps": st, "epochs": ep})
    return directory


def set_identity(directory, identities):
    """Rewrites the host and device of rank<r>.h5 in `directory` to identities[r]."""
    for r, (host, device) in enumerate(identities):
        with h5py.File(directory / f"rank{r}.h5", "r+") as f:
            f.attrs["host"] = host
            f.attrs["device"] = device
            f.attrs["gpu_name"] = "NVIDIA H200" if device.startswith("cuda") else " "
    return directory


def one_gpu_runs(fixtures, tmp_path, pp_devices=("cuda:0", "cuda:0"), dp_devices=("cuda:0", "cuda:0")):
    """HW5's four fixture runs as if run on one machine with GPUs: dp1 on cuda:0, dp2's and the
    pipelines' ranks on `dp_devices` / `pp_devices` (default: both ranks on cuda:0, sharing it)."""
    dirs = {}
    for key, name in HW5_RUNS.items():
        d = tmp_path / "runs" / name
        shutil.copytree(fixtures / name, d)
        devices = {"dp_single": ("cuda:0",), "dp_multi": dp_devices}.get(key, pp_devices)
        dirs[key] = set_identity(d, [("gpu-host", dev) for dev in devices])
    return dirs


def hw5_cli(dirs, out):
    return ["hw5", "--dp-single", str(dirs["dp_single"]), "--dp-multi", str(dirs["dp_multi"]),
            "--pp-model-parallel", str(dirs["pp_model"]), "--pp-pipeline", str(dirs["pp_pipeline"]),
            "--out", str(out)]


def flat(text):
    """A title with its line breaks as spaces (a long note is split over lines)."""
    return " ".join(text.split())


@pytest.fixture
def saved_titles(monkeypatch):
    """{final path: the titles and texts of every axes} of each figure saved while the test runs
    (plots and the timeline both save through Figure.savefig, to <name>.tmp.png first)."""
    seen = {}
    save = matplotlib.figure.Figure.savefig

    def keep(fig, fname, *args, **kwargs):
        texts = [t for ax in fig.axes for t in (ax.get_title(), ax.get_title("left"), ax.get_title("right"))]
        texts += [t.get_text() for ax in fig.axes for t in ax.texts]
        seen[str(fname).replace(".tmp.png", ".png")] = [flat(t) for t in texts if t]
        return save(fig, fname, *args, **kwargs)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    return seen


def says_note(texts):
    return any(NOTE in t for t in texts)


# --- detection from the rank files' identity -------------------------------------------------

@pytest.mark.parametrize("identities, phrase", [
    ([("node", "cuda:0"), ("node", "cuda:0")], "2 ranks shared one GPU"),
    ([("node", "cuda:0"), ("node", "cuda:1")], None),                      # a GPU each
    ([("a", "cuda:0"), ("b", "cuda:0")], None),                            # GPU 0 of two hosts
    ([("node", "cpu"), ("node", "cpu")], None),                            # CPU ranks
    ([("node", "cuda:0")], None),                                          # one rank
    ([("node", ""), ("node", "")], None),                                  # no device recorded
    ([("", "cuda:0"), ("", "cuda:0")], None),                              # no host recorded
    ([("a", "cuda:0"), ("a", "cuda:0"), ("b", "cuda:0"), ("b", "cuda:0")], "4 ranks shared 2 GPUs"),
    ([("a", "cuda:0"), ("a", "cuda:0"), ("a", "cuda:1"), ("a", "cuda:2")], "2 ranks shared one GPU"),
    ([("a", "cuda:0")] * 4, "4 ranks shared one GPU"),
])
def test_sharing_is_found_from_host_and_device(tmp_path, identities, phrase):
    run = read_run(write_dp_run(tmp_path / "run", identities))
    assert run.shares_gpu is (phrase is not None)
    assert run.sharing() == phrase
    assert shared_gpu_note([run]) == (f"{phrase}: {SHARED_GPU_CAVEAT}" if phrase else None)


def test_shared_gpus_names_the_gpu_and_its_ranks(tmp_path):
    run = read_run(write_dp_run(tmp_path / "run", [("a", "cuda:1"), ("a", "cuda:0"), ("a", "cuda:1")]))
    assert run.shared_gpus == {("a", "cuda:1"): [0, 2]}


def test_a_pipeline_run_on_one_gpu_shares_it(tmp_path):
    d = write_pipeline_run(tmp_path / "pp", dp=1, pp=2)
    assert not read_run(d).shares_gpu  # conftest writes CPU ranks on one host
    set_identity(d, [("node", "cuda:0"), ("node", "cuda:0")])
    assert read_run(d).sharing() == "2 ranks shared one GPU"


def test_note_over_several_runs():
    class R:
        def __init__(self, s):
            self.s = s

        def sharing(self):
            return self.s
    assert shared_gpu_note([None, R(None)]) is None
    assert shared_gpu_note([R("2 ranks shared one GPU"), None, R("2 ranks shared one GPU")]) == NOTE
    assert shared_gpu_note([R("2 ranks shared one GPU"), R("4 ranks shared 2 GPUs")]) == \
        f"2 ranks shared one GPU; 4 ranks shared 2 GPUs: {SHARED_GPU_CAVEAT}"


# --- performance_summary.json ------------------------------------------------------------------

def test_summary_says_ranks_shared_a_gpu_with_hw5_keys_unchanged(fixtures, tmp_path, capsys):
    dirs = one_gpu_runs(fixtures, tmp_path)
    out = tmp_path / "hw5"
    assert main(hw5_cli(dirs, out)) == 0
    assert f"# note: {NOTE}" in capsys.readouterr().out
    s = load_json(out / "performance_summary.json")
    assert set(s) == HW5_KEYS | SHARED_KEYS
    assert s["ranks_share_gpu"] is True and s["note"] == NOTE
    dp, pp = s["data_parallel"], s["pipeline_parallel"]
    assert set(dp) == DP_KEYS | DEFINITION | SHARED_KEYS and set(pp) == PP_KEYS | DEFINITION | SHARED_KEYS
    assert dp["ranks_share_gpu"] is True and dp["note"] == NOTE
    assert pp["ranks_share_gpu"] is True and pp["note"] == NOTE
    # HW5's numbers are those of the same files on CPU ranks: only the labels differ.
    plain = tmp_path / "plain"
    assert main(hw5_cli({k: fixtures / v for k, v in HW5_RUNS.items()}, plain)) == 0
    p = load_json(plain / "performance_summary.json")
    assert s["config"] == p["config"]
    for sec, keys in (("data_parallel", DP_KEYS), ("pipeline_parallel", PP_KEYS)):
        assert {k: s[sec][k] for k in keys | DEFINITION} == p[sec]
    details = load_json(out / "hw5_details.json")
    assert details["dp_multi"]["ranks_share_gpu"] is True and details["dp_multi"]["note"] == NOTE
    assert "ranks_share_gpu" not in details["dp_single"]  # one rank alone on its GPU
    assert [r["device"] for r in details["pp_pipeline"]["ranks"]] == ["cuda:0", "cuda:0"]


def test_only_the_section_whose_ranks_shared_says_so(fixtures, tmp_path):
    # Data parallel on two GPUs, the pipelines' ranks on one.
    dirs = one_gpu_runs(fixtures, tmp_path, dp_devices=("cuda:0", "cuda:1"))
    s = summary.hw5_summary(*(read_run(dirs[k]) for k in HW5_RUNS))
    assert s["ranks_share_gpu"] is True and s["note"] == NOTE
    assert s["data_parallel"]["ranks_share_gpu"] is False and "note" not in s["data_parallel"]
    assert s["pipeline_parallel"]["ranks_share_gpu"] is True and s["pipeline_parallel"]["note"] == NOTE
    # Missing sections stay null.
    s = summary.hw5_summary(None, None, read_run(dirs["pp_model"]), read_run(dirs["pp_pipeline"]))
    assert s["data_parallel"] is None and s["pipeline_parallel"]["ranks_share_gpu"] is True


def test_ranks_on_their_own_gpus_keep_hw5s_schema(fixtures, tmp_path):
    dirs = one_gpu_runs(fixtures, tmp_path, pp_devices=("cuda:0", "cuda:1"),
                        dp_devices=("cuda:0", "cuda:1"))
    out = tmp_path / "hw5"
    assert main(hw5_cli(dirs, out)) == 0
    s = load_json(out / "performance_summary.json")
    assert set(s) == HW5_KEYS
    assert set(s["data_parallel"]) == DP_KEYS | DEFINITION and set(s["pipeline_parallel"]) == PP_KEYS | DEFINITION


def test_cpu_ranks_on_one_host_are_not_sharing_a_gpu(fixtures, tmp_path, capsys):
    # The fixtures: CPU ranks ("cpu"), all on host "vm".
    runs = [read_run(fixtures / name) for name in HW5_RUNS.values()]
    assert all(r.ranks[0].attrs["host"] == "vm" and r.ranks[0].attrs["device"] == "cpu" for r in runs)
    assert not any(r.shares_gpu for r in runs) and shared_gpu_note(runs) is None
    assert main(hw5_cli({k: fixtures / v for k, v in HW5_RUNS.items()}, tmp_path)) == 0
    assert "note:" not in capsys.readouterr().out
    s = load_json(tmp_path / "performance_summary.json")
    assert set(s) == HW5_KEYS
    assert not any("ranks_share_gpu" in (s[k] or {}) for k in ("data_parallel", "pipeline_parallel"))
    assert "ranks_share_gpu" not in summary.run_summary(runs[1])


# --- plots -----------------------------------------------------------------------------------

def test_every_hw5_plot_says_ranks_shared_a_gpu(fixtures, tmp_path, saved_titles):
    dirs = one_gpu_runs(fixtures, tmp_path)
    out = tmp_path / "hw5"
    assert main(hw5_cli(dirs, out)) == 0
    for name in ("ddp_training_time", "ddp_tokens_per_second", "pp_training_time",
                 "pp_tokens_per_second"):
        path = out / f"{name}.png"
        assert says_note(saved_titles[str(path)]), (name, saved_titles[str(path)])
        assert path.stat().st_size > 10_000


def test_hw5_bars_name_ranks_on_one_gpu(fixtures, tmp_path, monkeypatch):
    dirs = one_gpu_runs(fixtures, tmp_path)
    runs = {k: read_run(d) for k, d in dirs.items()}
    s = summary.hw5_summary(runs["dp_single"], runs["dp_multi"], runs["pp_model"], runs["pp_pipeline"])
    ticks = {}
    save = plots._save

    def keep(fig, path):
        ticks[path.name] = [t.get_text() for ax in fig.axes for t in ax.get_xticklabels()]
        return save(fig, path)
    monkeypatch.setattr(plots, "_save", keep)
    plots.hw5_plots(s, tmp_path / "out", runs)
    assert ticks["ddp_training_time.png"] == ["Single GPU", "Data Parallel\n(2 ranks on 1 GPU)"]


def test_every_plot_of_the_bench_flow_says_so(fixtures, tmp_path, saved_titles):
    # What scripts/bench runs after the trainers: summarize, sweep, timeline, hw5.
    dirs = one_gpu_runs(fixtures, tmp_path)
    runs = [str(dirs[k]) for k in HW5_RUNS]
    out = tmp_path / "bench"
    assert main(["summarize", *runs, "--out", str(out / "summary")]) == 0
    assert main(["sweep", *runs, "--out", str(out / "sweep"), "--plan", str(fixtures / "plan.json")]) == 0
    assert main(["timeline", str(dirs["pp_pipeline"]), "--out", str(out / "timeline")]) == 0
    assert main(hw5_cli(dirs, out / "hw5")) == 0
    pngs = sorted(str(p) for p in out.rglob("*.png"))
    # step_breakdown + loss per run, 2 pipeline timelines, loss_curves, 2 sweeps, 1 timeline, 4 HW5
    assert len(pngs) == 4 * 2 + 2 + 1 + 2 + 1 + 4 and set(pngs) <= set(saved_titles)
    for png in pngs:
        # Only the 1-rank run's own figures (alone on its GPU) have nothing to say.
        assert says_note(saved_titles[png]) is ("/summary/dp1/" not in png), (png, saved_titles[png])
    # The JSON beside them.
    assert load_json(out / "summary" / "dp2" / "metrics.json")["note"] == NOTE
    assert "ranks_share_gpu" not in load_json(out / "summary" / "dp1" / "metrics.json")
    sweep = load_json(out / "sweep" / "sweep.json")
    shared = {p["run"].split("/")[-1]: p.get("ranks_share_gpu", False)
              for p in sweep["world_size"] + sweep["microbatches"]}
    assert shared == {"dp1": False, "dp2": True, "pp_mp": True, "pp_1f1b_m4": True}
    trace = load_json(out / "timeline" / "pipeline_trace.json")
    assert trace["otherData"]["ranks_share_gpu"] is True and trace["otherData"]["note"] == NOTE


def test_timeline_title_says_so(tmp_path):
    d = set_identity(write_pipeline_run(tmp_path / "pp", dp=1, pp=2),
                     [("node", "cuda:0"), ("node", "cuda:0")])
    fig, ax = timeline.gantt_figure(read_run(d))
    assert NOTE in flat(ax.get_title())
    set_identity(d, [("node", "cuda:0"), ("node", "cuda:1")])
    fig2, ax2 = timeline.gantt_figure(read_run(d))
    assert "shared" not in ax2.get_title()
    import matplotlib.pyplot as plt
    plt.close(fig)
    plt.close(fig2)


def test_sweep_plots_take_the_note_from_their_points(tmp_path, saved_titles):
    pts = [{"program": "dp_train", "world_size": w, "tok_s_mean": 1000.0 * w, "tok_s_std": 1.0,
            **({"ranks_share_gpu": True, "note": NOTE} if w == 2 else {})} for w in (1, 2)]
    plots.world_size_plot(pts, tmp_path / "w.png")
    assert says_note(saved_titles[str(tmp_path / "w.png")])
    plots.world_size_plot(pts[:1], tmp_path / "w1.png")
    assert not any("shared" in t for t in saved_titles[str(tmp_path / "w1.png")])


def test_long_notes_are_split_to_fit_the_figure():
    title = plots.titled("Data parallel: throughput", NOTE, 5.5)
    lines = title.split("\n")
    assert lines[0] == "Data parallel: throughput" and flat(" ".join(lines[1:])) == NOTE
    assert all(len(line) <= 60 for line in lines)
    assert plots.titled("T", NOTE, 11) == "T\n" + NOTE  # fits on one line
    assert plots.titled("T", None, 5.5) == "T"
