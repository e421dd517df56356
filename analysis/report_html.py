"""One HTML page per run (`summarize`, `watch`): the run's identity, its summary table, its plots
and, for a pipeline run, its timeline, in one file that can be copied or mailed on its own.

The page is self-contained and static: the plots are embedded as data: URIs (base64 PNG), the
style is inline, and it holds no script and fetches nothing; a Content-Security-Policy meta tag
says so to the browser (images from data: only, no scripts, no connections). Every string taken
from a rank file (names, hosts, devices, commits, the config) is untrusted and goes through
html.escape. Each number of the summary carries its exact value in a data-value attribute (the
float's repr, as in metrics.json) beside the text a reader reads (analysis/numbers.py)."""

from __future__ import annotations

import base64
import html
import json
import os
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence
from urllib.parse import quote

from analysis import metrics, plots, timeline
from analysis import numbers as fmt
from analysis.reader import Run, RunError

# What reading or drawing rows that are not all there yet may raise: h5py's errors (OSError,
# KeyError, RuntimeError), empty or unequal tables in the metrics and the plots (ValueError,
# IndexError, ZeroDivisionError), the reader's own (RunError).
ROW_ERRORS = (RunError, OSError, KeyError, RuntimeError, ValueError, IndexError, ZeroDivisionError)
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 1100px; color: #222;
       padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25em 0.7em; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.def { color: #555; font-size: 0.9em; max-width: 44em; }
#status { display: inline-block; padding: 0.2em 0.7em; border-radius: 4px; font-weight: 600; }
.running { background: #fff3cd; } .finished { background: #d4edda; } .stale { background: #f8d7da; }
.unfinished { background: #f8d7da; } .note { background: #fff3cd; padding: 0.4em 0.7em; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #444; font-size: 0.9em; max-width: 60em; }
"""


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def write_text(path, text: str) -> Path:
    """Writes atomically (a temporary file in the same directory, then os.replace), so that a
    browser reading the page meanwhile sees the old one or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(png).read_bytes()).decode("ascii")


def draw(run: Run, out_dir, warmup: Optional[int] = None,
         failures: Optional[List[str]] = None) -> List[Dict[str, object]]:
    """Draws the run's plots into `out_dir` (step_breakdown.png, loss.png, and for a pipeline run
    pipeline_timeline.png with pipeline_trace.json) and returns the page's figures: id, title,
    path, caption. With a `failures` list, a plot that cannot be drawn from the rows there are
    yet (a run just begun) is left out and the reason appended there instead of raised."""
    out_dir = Path(out_dir)
    figs = [
        {"id": "step-breakdown", "title": "Step time breakdown", "path": out_dir / "step_breakdown.png",
         "caption": "Mean time per optimizer step after warm-up, per rank and phase; the note "
                    "under the plot says what each phase holds.",
         "draw": lambda p: plots.step_breakdown_plot(run, p, warmup)},
        {"id": "loss", "title": "Loss", "path": out_dir / "loss.png",
         "caption": "Train loss per optimizer step (the model's rank); validation loss per epoch, "
                    "dots at the epochs' ends.",
         "draw": lambda p: plots.loss_plot([run], p)}]
    if metrics.actions(run)["step"].size:
        figs.append({"id": "timeline", "title": "Pipeline timeline", "path": out_dir / "pipeline_timeline.png",
                     "caption": "One optimizer step: a row per rank, a box per forward/backward "
                                "micro-batch, communication as thin boxes under the row, bubbles as "
                                "gaps, the gradient sync before the optimizer dotted. The whole run "
                                "is in pipeline_trace.json beside this page (chrome://tracing, "
                                "ui.perfetto.dev).",
                     "draw": lambda p: timeline.write_timeline(run, p.parent)})
    made = []
    for f in figs:
        try:
            f.pop("draw")(f["path"])
        except ROW_ERRORS as e:
            if failures is None:
                raise
            failures.append(f"{f['title']} not drawn: {type(e).__name__}: {e}")
            continue
        made.append(f)
    return made


def _value(x) -> str:
    """The exact value for data-value: the float's repr (as json writes it), "" when missing."""
    return repr(float(x)) if fmt.finite(x) else ""


def _num(cell_id: str, text: str, value, std=None) -> str:
    spread = f' data-std="{_value(std)}"' if std is not None else ""
    return f'<td id="{esc(cell_id)}" class="num" data-value="{_value(value)}"{spread}>{esc(text)}</td>'


def _row(label: str, cell: str, definition: str = "") -> str:
    return f"<tr><th>{esc(label)}</th>{cell}<td class=\"def\">{esc(definition)}</td></tr>"


def _attr(run: Run, name: str) -> List[str]:
    """The distinct non-blank values of a root attribute over the ranks, in rank order."""
    out: List[str] = []
    for r in run.ranks:
        v = str(r.attrs.get(name, "") or "").strip()
        if v and v not in out:
            out.append(v)
    return out


def _identity(run: Run, s: Dict) -> str:
    devices = []
    for r in run.ranks:
        d = " ".join(x for x in (str(r.attrs.get("host", "") or "").strip(),
                                 str(r.attrs.get("device", "") or "").strip(),
                                 str(r.attrs.get("gpu_name", "") or "").strip()) if x)
        if d and d not in devices:
            devices.append(d)
    versions = ""
    try:
        v = json.loads(str(run.ranks[0].attrs.get("versions", "") or "{}"))
        if isinstance(v, dict):
            versions = ", ".join(f"{k} {val}" for k, val in v.items())
    except ValueError:
        versions = str(run.ranks[0].attrs.get("versions", ""))
    ranks = f"{run.world_size}" + (f" ({run.dp} replicas x {run.pp} pipeline ranks)" if run.hybrid else "")
    rows = [("run", run.name), ("what", run.label()), ("program", run.program), ("ranks", ranks),
            ("devices", "; ".join(devices) or "-"), ("commit", ", ".join(_attr(run, "git_commit")) or "-"),
            ("started", ", ".join(_attr(run, "started")) or "-"), ("versions", versions or "-"),
            ("folder", str(run.path))]
    out = ['<h2 id="identity">Run</h2><table class="identity">']
    out += [f'<tr><th>{esc(k)}</th><td id="id-{esc(k)}">{esc(v)}</td></tr>' for k, v in rows]
    out.append("</table>")
    if s.get("note"):
        out.append(f'<p class="note" id="shared-gpu">{esc(s["note"])}</p>')
    unfinished = [r["file"] for r in s["ranks"] if r["partial"]]
    if unfinished:
        out.append(f'<p class="note" id="unfinished">Unfinished rank files (the run is going or '
                   f'stopped early): {esc(", ".join(unfinished))}</p>')
    hybrid = run.hybrid
    head = ["rank"] + (["replica", "pipeline rank"] if hybrid else []) + ["host", "device", "GPU",
                                                                          "commit", "file", "steps", "epochs"]
    out.append('<table id="ranks"><tr>' + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>")
    for r in s["ranks"]:
        cells = [r["rank"]] + ([r["dp_rank"], r["pp_rank"]] if hybrid else [])
        cells += [str(r.get(k) or "").strip() or "-" for k in ("host", "device", "gpu_name", "git_commit")]
        cells += [r["file"], r["steps"], r["epochs"]]
        out.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    out.append("</table>")
    cfg = run.config if isinstance(run.config, dict) else {}
    out.append(f"<details><summary>config ({len(cfg)} settings)</summary><table id=\"config\">")
    out += [f"<tr><th>{esc(k)}</th><td>{esc(json.dumps(v))}</td></tr>" for k, v in sorted(cfg.items())]
    out.append("</table></details>")
    return "\n".join(out)


STEP_TIME_DEFINITION = ("wall time per optimizer step (/steps end - start), mean over the steps "
                        "after warm-up, of the slowest rank (every rank's below)")


def _summary(run: Run, s: Dict) -> str:
    t, p, loss = s["throughput"], s["performance"], s["losses"]
    n_tok, n_hw5 = len(t["epochs_used"]), len(p["epochs_used"])
    epochs = (f"{n_tok} epoch(s) averaged, {t['warmup_epochs_dropped']} warm-up epoch(s) dropped"
              if n_tok else "no epoch finished on every rank yet")
    steps = s["step_breakdown"]
    step_time = max((r["total"] for r in steps if r["steps"]), default=float("nan"))
    c = run.config
    progress = f"{len(metrics.epoch_table(run)['epoch'])} of {c.get('epochs', '?')}"
    rows = [
        _row("epochs finished", f'<td id="epochs-done" class="num">{esc(progress)}</td>', epochs),
        _row(metrics.TOK_S_LABEL, _num("tok-s", fmt.mean_pm(t["tok_s_mean"], t["tok_s_std"], n_tok) + " tok/s",
                                       t["tok_s_mean"], t["tok_s_std"]), t["tok_s_definition"]),
        _row("step time", _num("step-time", fmt.ms(step_time), step_time), STEP_TIME_DEFINITION),
        _row("train loss (last step)", _num("train-loss", fmt.sig(loss["final_train_loss"], 4),
                                            loss["final_train_loss"]), "cross-entropy, nats/token"),
        _row("validation loss (last epoch)", _num("val-loss", fmt.sig(loss["final_val_loss"], 4),
                                                  loss["final_val_loss"]),
             f"perplexity {fmt.sig(loss['final_val_ppl'], 4)}"),
        _row("HW5 time/epoch", _num("hw5-time", fmt.mean_pm(p["time_mean"], p["time_std"], n_hw5,
                                                            suffix=False) + " s",
                                    p["time_mean"], p["time_std"]), p["time_definition"]),
        _row("HW5 tok/s", _num("hw5-tok", fmt.mean_pm(p["tok_mean"], p["tok_std"], n_hw5) + " tok/s",
                               p["tok_mean"], p["tok_std"]), p["tokens_per_sec_definition"])]
    b = s.get("pipeline_bubble")
    if b:
        rows.append(_row("pipeline idle", _num("bubble", fmt.percent(b["measured"]), b["measured"]),
                         f"measured idle fraction of the step (ideal bubble (P-1)/(V M+P-1): "
                         f"{fmt.percent(b['ideal'])})"))
    out = ['<h2 id="summary">Summary</h2><table id="summary-table">'] + rows + ["</table>"]
    out.append(_epochs(run, s))
    out.append(_breakdown(steps))
    return "\n".join(out)


def _epochs(run: Run, s: Dict) -> str:
    t, p = s["throughput"], s["performance"]
    numbers = metrics.epoch_table(run)["epoch"].tolist()
    if not numbers:
        return ""
    e = metrics.loss_rank(run).table("epochs")
    val = {int(k): v for k, v in zip(e.get("epoch", []), e.get("val_loss", []))}
    out = ['<table id="epochs"><tr><th>epoch</th><th>tok/s (all ranks, padded)</th><th>HW5 tok/s</th>'
           "<th>HW5 time</th><th>validation loss</th><th></th></tr>"]
    for i, ep in enumerate(numbers):
        used = ep in t["epochs_used"]
        out.append(f"<tr><td>{ep}</td>" + _num(f"epoch-{ep}-tok-s", fmt.tok_s(t["tok_s_per_epoch"][i]),
                                               t["tok_s_per_epoch"][i])
                   + _num(f"epoch-{ep}-hw5-tok", fmt.tok_s(p["tok_per_epoch"][i]), p["tok_per_epoch"][i])
                   + _num(f"epoch-{ep}-time", fmt.seconds(p["time_per_epoch"][i]), p["time_per_epoch"][i])
                   + _num(f"epoch-{ep}-val-loss", fmt.sig(val.get(ep, float("nan")), 4), val.get(ep))
                   + f"<td>{'' if used else 'warm-up, not averaged'}</td></tr>")
    out.append("</table><p class=\"def\">Epochs counted from 0, as the rank files and HW5's lines "
               "count them.</p>")
    return "\n".join(out)


def _breakdown(steps: Sequence[Dict]) -> str:
    phases = list(metrics.PHASES) + ["other", "total"]
    names = dict(plots.PHASE_LABELS, total="step")
    out = ['<table id="step-breakdown-table"><tr><th>rank</th><th>steps</th>'
           + "".join(f"<th>{esc(names[ph])}</th>" for ph in phases) + "</tr>"]
    for r in steps:
        who = f"replica {r['replica']}, rank {r['pp_rank']}" if "replica" in r else f"rank {r['rank']}"
        out.append(f"<tr><td>{esc(who)}</td><td class=\"num\">{r['steps']}</td>"
                   + "".join(_num(f"rank-{r['rank']}-{ph}", fmt.ms(r[ph]), r[ph]) for ph in phases) + "</tr>")
    out.append("</table><p class=\"def\">Mean time per step after warm-up, per phase (the plot's "
               "caption says what each holds).</p>")
    return "\n".join(out)


def _figures(figs: Sequence[Dict], notes: Sequence[str]) -> str:
    out = ['<h2 id="plots">Plots</h2>']
    for f in figs:
        out.append(f'<figure id="fig-{esc(f["id"])}"><img alt="{esc(f["title"])}" src="{data_uri(f["path"])}">'
                   f'<figcaption>{esc(f["title"])}: {esc(f["caption"])}</figcaption></figure>')
    if notes:
        out.append('<h2 id="notes-heading">Notes from reading the rank files</h2><ul id="notes">'
                   + "".join(f"<li>{esc(x)}</li>" for x in notes) + "</ul>")
    return "\n".join(out)


def run_body(run: Run, s: Dict, figs: Sequence[Dict], notes: Sequence[str] = ()) -> str:
    """The page's content below its status line: identity, summary, plots, and `notes` (what the
    reader warned about, plots not drawn)."""
    parts = [f"<h1>{esc(run.name)}: {esc(run.label())}</h1>", "<!-- status -->",
             _identity(run, s), _summary(run, s), _figures(figs, notes)]
    return "\n".join(parts)


def document(title: str, body: str, status: str = "", status_class: str = "", refresh: Optional[int] = None) -> str:
    """A whole page. `status` (escaped here) goes under the heading, in a box styled by
    `status_class` (running, finished, stale, unfinished); `refresh` (seconds) adds the meta tag
    that makes an open browser tab reload the page."""
    meta = f'<meta http-equiv="refresh" content="{int(refresh)}">' if refresh else ""
    line = (f'<p><span id="status" class="{esc(status_class)}">{esc(status)}</span></p>'
            if status else "")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">{meta}'
            f"<title>{esc(title)}</title><style>{STYLE}</style></head>\n<body>\n"
            + body.replace("<!-- status -->", line, 1) + "\n</body></html>\n")


def run_page(run: Run, s: Dict, figs: Sequence[Dict]) -> str:
    """The page `summarize` writes: status "finished", or "unfinished" with .partial files."""
    status, cls = ("unfinished: rank files still .partial", "unfinished") if run.partial else ("finished", "finished")
    return document(f"{run.name}: {run.label()}", run_body(run, s, figs), status, cls)


def index_page(rows: Sequence[Dict]) -> str:
    """The page linking several runs' pages: rows of {name, label, throughput, losses, partial}
    (summarize's summary.json rows)."""
    out = ["<h1>Runs</h1>", '<table id="runs"><tr><th>run</th><th>what</th>'
           f"<th>{esc(metrics.TOK_S_LABEL)}</th><th>validation loss</th><th>state</th></tr>"]
    for r in rows:
        t = r["throughput"]
        href = quote(str(r["name"])) + "/index.html"
        out.append(f'<tr><td><a href="{esc(href)}">{esc(r["name"])}</a></td><td>{esc(r["label"])}</td>'
                   + _num(f"run-{r['name']}-tok-s", fmt.mean_pm(t["tok_s_mean"], t["tok_s_std"],
                                                                len(t["epochs_used"])), t["tok_s_mean"])
                   + _num(f"run-{r['name']}-val-loss", fmt.sig(r["losses"]["final_val_loss"], 4),
                          r["losses"]["final_val_loss"])
                   + f"<td>{'unfinished' if r['partial'] else 'finished'}</td></tr>")
    out.append(f"</table><p class=\"def\">{esc(metrics.TOK_S_DEFINITION)}.</p>")
    return document("Runs", "\n".join(out))
