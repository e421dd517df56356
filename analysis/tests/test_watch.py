"""`watch`: the run's page rewritten while its rank files are written, by a writer process that
holds them open as a trainer does (HDF5's lock included), and by a real tiny CPU run where the
programs are built."""

import html
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest

from analysis.__main__ import main
from analysis.watch import Watcher
from browser import dump_dom
from conftest import FIXTURES, ROOT, load_json, write_rank_file

# Copies a finished run's rank files row by row into <run>/rank<r>.h5.partial, flushing after each
# row as the trainers do (include/gpt2p/io/h5_writer.h), with h5py's default file lock held like
# theirs; after `hold` epochs it waits for <run>/go, then writes the rest and renames the files.
WRITER = r"""
import sys, time
from pathlib import Path
import h5py, numpy as np
src, run, hold = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
run.mkdir(parents=True, exist_ok=True)
files = []
for s in sorted(src.glob("rank*.h5")):
    f = h5py.File(run / (s.name + ".partial"), "w")
    with h5py.File(s, "r") as g:
        for k, v in g.attrs.items():
            f.attrs[k] = v
        tables = {t: {c: g[t][c][...] for c in g[t]} for t in ("steps", "epochs") if t in g}
    for t, cols in tables.items():
        for c in cols:
            f.create_dataset(f"{t}/{c}", shape=(0,), maxshape=(None,), dtype="f8", chunks=(64,))
    f.flush()
    files.append((f, tables))
def append(f, t, cols, i):
    for c, v in cols.items():
        d = f[t][c]
        d.resize((d.shape[0] + 1,))
        d[-1] = v[i]
    f.flush()
epochs = int(files[0][1]["epochs"]["epoch"].size)
for e in range(epochs):
    if e == hold:
        print("holding", flush=True)
        while not (run / "go").exists():
            time.sleep(0.05)
    for f, tables in files:
        steps = tables["steps"]
        for i in np.flatnonzero(steps["epoch"] == e):
            append(f, "steps", steps, i)
            time.sleep(0.02)
        append(f, "epochs", tables["epochs"], e)
for f, _ in files:
    name = Path(f.filename)
    f.close()
    name.rename(name.with_suffix(""))
print("closed", flush=True)
"""


def status(page: Path):
    """(class, text) of the page's status line, or None before there is a page."""
    if not page.exists():
        return None
    m = re.search(r'<span id="status" class="([^"]*)">([^<]*)</span>', page.read_text())
    return (m.group(1), html.unescape(m.group(2))) if m else None


def wait_for(what, predicate, timeout=60.0, procs=()):
    end = time.time() + timeout
    while time.time() < end:
        value = predicate()
        if value:
            return value
        for p in procs:
            assert p.poll() is None or p.returncode == 0, f"{p.args}: exit {p.returncode}"
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def start_watch(run, out, every="0.3"):
    return subprocess.Popen([sys.executable, "-m", "analysis", "watch", str(run), "--out", str(out),
                             "--every", every], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_watch_follows_a_run_being_written_until_it_finishes(tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    page = out / "index.html"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(FIXTURES / "dp2"), str(run), "2"],
                              stdout=subprocess.PIPE, text=True)
    procs = [writer]
    try:
        wait_for("the writer to hold", lambda: writer.stdout.readline().strip() == "holding", procs=procs)
        with pytest.raises(OSError, match="lock"):  # the writer holds HDF5's lock, as a trainer does
            h5py.File(run / "rank0.h5.partial", "r")
        # Ctrl-C: exit 0, the page no longer refreshing and saying so.
        first = start_watch(run, out)
        procs.append(first)
        wait_for("a running page", lambda: (status(page) or ("",))[0] == "running" and "steps" in page.read_text(),
                 procs=procs)
        dom = dump_dom(tmp_path, page)
        assert dom.text("status").startswith("running (updated ")
        assert {"http-equiv": "refresh", "content": "1"} in dom.all("meta")
        assert dom.text("epochs-done") == "2 of 3"
        assert "rank0.h5.partial, rank1.h5.partial" in dom.text("unfinished")
        first.send_signal(signal.SIGINT)
        assert first.wait(30) == 0, first.stderr.read()
        assert status(page)[0] == "stale" and status(page)[1].startswith("not finished when the watch stopped")
        assert 'http-equiv="refresh"' not in page.read_text()
        # The run finishes: "finished", exit 0.
        second = start_watch(run, out)
        procs.append(second)
        wait_for("running again", lambda: (status(page) or ("",))[0] == "running", procs=procs)
        (run / "go").touch()
        assert second.wait(60) == 0, second.stderr.read()
        assert writer.wait(30) == 0
        assert f"watch: {run} finished" in second.stdout.read()
        assert status(page) == ("finished", "finished")
        assert 'http-equiv="refresh"' not in page.read_text()
        # The page's numbers are those of the run the writer copied.
        assert main(["summarize", str(FIXTURES / "dp2"), "--out", str(tmp_path / "ref")]) == 0
        ref = load_json(tmp_path / "ref" / "dp2" / "metrics.json")["throughput"]["tok_s_mean"]
        assert load_json(out / "metrics.json")["throughput"]["tok_s_mean"] == ref
        assert f'id="tok-s" class="num" data-value="{ref!r}"' in page.read_text()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_an_unreadable_moment_keeps_the_last_good_page(tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    shutil.copytree(FIXTURES / "dp2", run)
    (run / "rank1.h5").rename(run / "rank1.h5.partial")
    w = Watcher(run, out, every=2.5)
    assert w.tick(now=1_000_000.0) is False
    page = out / "index.html"
    good = page.read_text()
    assert status(page)[1].startswith("running (updated ") and '<meta http-equiv="refresh" content="3">' in good
    tok = re.search(r'id="tok-s" class="num" data-value="([^"]*)"', good).group(1)
    (run / "rank1.h5.partial").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)  # half a file
    assert w.tick(now=1_000_030.0) is False
    cls, text = status(page)
    assert cls == "stale" and "could not read the rank files at" in text and "showing them as of" in text
    assert f'id="tok-s" class="num" data-value="{tok}"' in page.read_text()
    assert '<meta http-equiv="refresh"' in page.read_text()
    (run / "rank1.h5.partial").unlink()
    shutil.copy(FIXTURES / "dp2" / "rank1.h5", run / "rank1.h5")
    assert w.tick() is True
    assert status(page) == ("finished", "finished")
    assert not list(out.glob("*.tmp"))  # every page went through a temporary file and a rename


def test_a_run_just_begun_gets_a_page_without_numbers(tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    run.mkdir()
    with h5py.File(FIXTURES / "dp1" / "rank0.h5", "r") as f:
        attrs = dict(f.attrs)
        columns = {t: {c: [] for c in f[t]} for t in ("steps", "epochs")}
    write_rank_file(run / "rank0.h5.partial", attrs, columns)
    assert Watcher(run, out, every=1).tick() is False
    text = (out / "index.html").read_text()
    assert status(out / "index.html")[0] == "running"
    assert 'id="epochs-done" class="num">0 of 3<' in text and 'id="tok-s" class="num" data-value=""' in text


@pytest.mark.parametrize("where, message", [
    ("empty", "not a run folder: no rank<r>.h5 or rank<r>.h5.partial files"),
    ("missing", "no such folder"),
    ("parent", "not a run folder but one holding 2 run(s)")])
def test_a_folder_that_is_not_a_run_is_one_line_and_exit_2(tmp_path, capsys, where, message):
    path = tmp_path / where
    if where == "empty":
        path.mkdir()
    elif where == "parent":
        for name in ("dp1", "dp2"):
            shutil.copytree(FIXTURES / name, path / name)
    assert main(["watch", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "out").exists()


def built():
    b = Path(os.environ.get("GPT2P_BIN") or ROOT / "build")
    vocab = Path(os.environ.get("GPT2P_VOCAB_DIR") or ROOT / ".cache" / "gpt2-vocab")
    ok = all(os.access(b / p, os.X_OK) for p in ("dp_train", "prepare_data"))
    return (b, vocab) if ok and (vocab / "encoder.json").is_file() and shutil.which("mpirun") else None


@pytest.mark.skipif(built() is None, reason="dp_train is not built (set GPT2P_BIN or build build/) or "
                                            "the GPT-2 vocabulary is missing (scripts/setup)")
def test_watch_follows_a_real_cpu_run(tmp_path):
    b, vocab = built()
    env = dict(os.environ, GPT2P_VOCAB_DIR=str(vocab), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    data = ROOT / ".cache" / "data" / "ding-gpt2.h5"
    if not (data.is_file() and data.open("rb").read(16) == b"gpt2p-dataset 1 "):
        data = tmp_path / "ding-gpt2.h5"
        subprocess.run([str(b / "prepare_data"), "--out", str(data)], env=env, check=True,
                       capture_output=True, timeout=300)
    run, out = tmp_path / "run", tmp_path / "out"
    trainer = subprocess.Popen(
        ["mpirun", "--oversubscribe", "-np", "2", str(b / "dp_train"), "--preset", "tiny", "--device", "cpu",
         "--max-train-pairs", "48", "--max-eval-pairs", "16", "--batch-size", "16", "--seq-len", "32",
         "--epochs", "2", "--warmup-epochs", "0", "--log-every", "1", "--translate-samples", "0",
         "--data", str(data), "--out", str(run)], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    procs = [trainer]
    try:
        wait_for("the trainer's folder", lambda: (run / "config.ini").exists() or (run / "run.lock").exists(),
                 procs=procs)
        watcher = start_watch(run, out, every="0.5")
        procs.append(watcher)
        seen, rows = set(), 0  # the statuses shown; the most steps a running page showed
        while watcher.poll() is None:
            s = status(out / "index.html")
            if s:
                seen.add(s[1].split(" (")[0])
                m = re.search(r"rank0\.h5\.partial</td><td>(\d+)</td>", (out / "index.html").read_text())
                rows = max(rows, int(m.group(1)) if m and s[0] == "running" else 0)
            time.sleep(0.1)
        assert trainer.wait(120) == 0, trainer.stdout.read()[-3000:]
        assert watcher.returncode == 0, watcher.stderr.read()
        assert "running" in seen and rows > 0, (seen, rows)  # read while the trainer wrote it
        assert status(out / "index.html") == ("finished", "finished")
        m = load_json(out / "metrics.json")
        assert m["world_size"] == 2 and [r["file"] for r in m["ranks"]] == ["rank0.h5", "rank1.h5"]
        assert main(["summarize", str(run), "--out", str(tmp_path / "ref")]) == 0
        ref = load_json(tmp_path / "ref" / "run" / "metrics.json")["throughput"]["tok_s_mean"]
        assert m["throughput"]["tok_s_mean"] == ref > 0
        assert f'id="tok-s" class="num" data-value="{ref!r}"' in (out / "index.html").read_text()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
