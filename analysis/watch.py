"""`python3 -m analysis watch RUN_DIR --out DIR`: the run's page (report_html) while the run goes
on, rewritten every --every seconds from what its rank files hold at that moment.

A running trainer writes rank<r>.h5.partial, flushed after every row, and renames it to rank<r>.h5
when it closes it (include/gpt2p/io/h5_writer.h). The reader opens a .partial file without HDF5's
file lock, which the writer holds (reader._open). A moment when a file does not read whole (a
row half-flushed, a rename under way) keeps the last good page, marked with the time of the
failed read and why. The page carries <meta http-equiv="refresh"> so that an open tab follows,
and says "running (updated HH:MM:SS)". The watch ends, exit 0, when every rank's final file is
there (rank<r>.h5 for r < world_size): the page then says "finished" and stops refreshing. Ctrl-C
ends it too, exit 0, the page marked as no longer updated. A folder that is not a run folder is
a one-line error, exit 2."""

from __future__ import annotations

import contextlib
import io
import math
import sys
import time
from pathlib import Path
from typing import List, Optional

from analysis import report_html, summary
from analysis.reader import RANK_FILE, RunError, find_runs, read_run

EXIT_NOT_A_RUN = 2


class NotARunFolder(RunError):
    """The folder given to watch is not one run's --out directory."""


def check_folder(path: Path) -> None:
    """Raises NotARunFolder unless `path` holds one run's rank files, or the files a trainer makes
    before them (run.lock, config.ini)."""
    if not path.is_dir():
        raise NotARunFolder(f"{path}: no such folder; pass the --out directory of a running trainer")
    names = [p.name for p in path.iterdir()]
    if any(RANK_FILE.match(n) for n in names) or "run.lock" in names or "config.ini" in names:
        return
    below = find_runs(path)
    if below:
        listed = ", ".join(str(d) for d in below[:3]) + (", ..." if len(below) > 3 else "")
        raise NotARunFolder(f"{path}: not a run folder but one holding {len(below)} run(s) ({listed}); "
                            "watch one of them")
    raise NotARunFolder(f"{path}: not a run folder: no rank<r>.h5 or rank<r>.h5.partial files, no "
                        "run.lock or config.ini; pass the --out directory of a trainer")


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


class Watcher:
    """Writes out/index.html (with metrics.json and the plots beside it) for the run in `run_dir`;
    tick() once per refresh."""

    def __init__(self, run_dir, out, every: float, warmup: Optional[int] = None):
        self.run_dir, self.out = Path(run_dir), Path(out)
        self.every, self.warmup = every, warmup
        self.page = self.out / "index.html"
        self.last: Optional[tuple] = None  # (title, body, when) of the last good read

    def _write(self, title: str, body: str, status: str, cls: str, refresh: bool) -> None:
        report_html.write_text(self.page, report_html.document(
            title, body, status, cls, max(1, math.ceil(self.every)) if refresh else None))

    def tick(self, now: Optional[float] = None) -> bool:
        """Reads the run and writes the page; True when the run has finished."""
        now = time.time() if now is None else now
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                run = read_run(self.run_dir)
                s = summary.run_summary(run, self.warmup)
                failures: List[str] = []
                figs = report_html.draw(run, self.out, self.warmup, failures)
                summary.write_json(self.out / "metrics.json", s)
            notes = [line.replace("analysis: warning: ", "", 1) for line in said.getvalue().splitlines()
                     if line.strip()]
            body = report_html.run_body(run, s, figs, failures + notes)
        except report_html.ROW_ERRORS as e:
            self._stale(now, e)
            return False
        finished = not run.partial and len(run.ranks) >= run.world_size
        title = f"{run.name}: {run.label()}"
        self.last = (title, body, now)
        if finished:
            self._write(title, body, "finished", "finished", refresh=False)
        else:
            self._write(title, body, f"running (updated {clock(now)})", "running", refresh=True)
        return finished

    def _stale(self, now: float, error: BaseException) -> None:
        why = " ".join(str(error).split()) or type(error).__name__
        if self.last is None:
            self._write(self.run_dir.name, self._empty(f"Nothing to show yet: {why}"),
                        f"waiting for the rank files ({clock(now)})", "running", True)
            return
        title, body, when = self.last
        self._write(title, body, f"running; could not read the rank files at {clock(now)} ({why}); "
                                 f"showing them as of {clock(when)}", "stale", refresh=True)

    def stopped(self, now: Optional[float] = None) -> None:
        """After Ctrl-C: the page stays as it was read last, marked as no longer updated."""
        now = time.time() if now is None else now
        title, body, when = self.last or (self.run_dir.name, self._empty("The rank files were not read."), None)
        self._write(title, body, f"not finished when the watch stopped at {clock(now)}"
                                 + (f"; the rank files as of {clock(when)}" if when else ""), "stale",
                    refresh=False)

    def _empty(self, text: str) -> str:
        return (f"<h1>{report_html.esc(self.run_dir.name)}</h1><!-- status -->"
                f"<p>{report_html.esc(text)}</p>")


def watch(run_dir, out, every: float, warmup: Optional[int] = None) -> int:
    run_dir = Path(run_dir)
    check_folder(run_dir)
    w = Watcher(run_dir, out, every, warmup)
    print(f"watch: writing {w.page} every {every:g} s until {run_dir} finishes (Ctrl-C to stop)",
          flush=True)
    try:
        while not w.tick():
            time.sleep(every)
    except KeyboardInterrupt:
        w.stopped()
        print(f"watch: stopped; {w.page} shows the run as last read", flush=True)
        return 0
    print(f"watch: {run_dir} finished; {w.page}", flush=True)
    return 0


def cmd_watch(args) -> int:
    if not args.every > 0:
        raise RunError(f"--every {args.every}: give a positive number of seconds")
    try:
        return watch(args.run, args.out, args.every, args.warmup_epochs)
    except NotARunFolder as e:
        print(f"analysis: error: {e}", file=sys.stderr)
        return EXIT_NOT_A_RUN
