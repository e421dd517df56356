"""How analysis/matrix_table.py shows its rows: the columns of the table (text for table.txt,
Markdown for README.md), the note under it on how tokens/s are counted, and the README of a
scripts/benchmark output directory (machine, commit, date, command, the table, the anchors'
lines, the files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

from analysis import metrics
from analysis import numbers as fmt

TOK_S_HEAD = "tok/s (all ranks)"
ANCHOR_TOK_S_HEAD = "anchor tok/s"


def tok_s_note(warmup: int) -> str:
    """What the tok/s columns are, for under the table."""
    return (f"{TOK_S_HEAD}: {metrics.TOKENS_COUNTED} per second of the step's time (the slowest "
            f"rank's); the median over every repetition's steps after the first {warmup}. "
            f"{ANCHOR_TOK_S_HEAD}: the anchor's, counted alike.")


COLUMNS = [  # header, cell
    ("row", lambda r: r["name"]),
    ("np", lambda r: str(r["ranks"])),
    (TOK_S_HEAD, lambda r: fmt.count(r.get("tok_s"))),
    ("step", lambda r: fmt.ms(r.get("step_s"))),
    ("peak", lambda r: fmt.gib(r.get("peak_bytes"))),
    ("MFU", lambda r: fmt.percent(r.get("mfu"))),
    ("loss", lambda r: f"{r['loss']:.3f}" if fmt.finite(r.get("loss")) else fmt.MISSING),
    (ANCHOR_TOK_S_HEAD, lambda r: fmt.count(r.get("anchor_tok_s"))),
    ("anchor peak", lambda r: fmt.gib((r.get("anchor_gib") or float("nan")) * 2**30)),
    ("ours/anchor", lambda r: fmt.ratio(r.get("vs_anchor"))),
    ("ours/base", lambda r: fmt.ratio(r.get("vs_base")) + (f" ({r['base']})" if fmt.finite(r.get("vs_base")) else "")),
    ("status", lambda r: r["status"]),
]


def cells(rows: List[Dict]):
    """Header and cells, without the columns that are empty in every row."""
    grid = [[cell(r) for _, cell in COLUMNS] for r in rows]
    keep = [j for j, (head, _) in enumerate(COLUMNS)
            if head in ("row", "np", "status") or any(g[j] != fmt.MISSING for g in grid)]
    return [COLUMNS[j][0] for j in keep], [[g[j] for j in keep] for g in grid]


def text_table(rows: List[Dict]) -> str:
    head, grid = cells(rows)
    widths = [max(len(x) for x in col) for col in zip(head, *grid)]
    right = {"np", TOK_S_HEAD, "step", "peak", "MFU", "loss", ANCHOR_TOK_S_HEAD, "anchor peak", "ours/anchor"}

    def line(values):
        return "  ".join(v.rjust(w) if h in right else v.ljust(w)
                         for h, v, w in zip(head, values, widths)).rstrip()
    return "\n".join([line(head)] + [line(g) for g in grid]) + "\n"


def markdown_table(rows: List[Dict]) -> str:
    head, grid = cells(rows)
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(v.replace("|", "\\|") for v in g) + " |" for g in grid]
    return "\n".join(out) + "\n"


def readme(out: Path, doc: Dict, rows: List[Dict], anchors: List[Dict]) -> str:
    machine = (out / "machine.txt").read_text().strip() if (out / "machine.txt").exists() else "?"
    reps = doc["repeat"]
    text = [f"# {doc['title']}", "",
            f"- Machine: {machine.splitlines()[0] if machine else '?'}",
            *[f"  {line}" for line in machine.splitlines()[1:]],
            f"- Commit: {doc['commit']}",
            f"- Date: {doc['date']}",
            f"- Matrix: `{doc['matrix']}` (copied to `matrix.tsv`): {len(rows)} rows, "
            f"{reps} repetition{'s' if reps != 1 else ''}; each repetition runs every row, then every anchor.",
            "", "Command:", "", "```", doc["command"], "```", "",
            "## Table", "",
            f"{tok_s_note(doc['warmup_steps'])} step: the median step time over the same steps. "
            "peak: the largest peak memory of any rank. "
            "ours/anchor: our tokens/s over the anchor's (the PyTorch script named in the matrix, "
            "same work, same invocation). ours/base: our tokens/s over the named row's (a pp_plan row: "
            "over its predicted step). `table.txt` and `table.json` hold the same; "
            "`analysis/matrix_table.py` documents every column.", "",
            markdown_table(rows)]
    if anchors:
        text += ["## Anchors", ""]
        for a in anchors:
            text += [f"`{a['command']}`", ""]
            for rep in a["reps"]:
                text.append(f"- rep {rep['rep']}: rc {rep['rc']}, {fmt.seconds(rep['seconds'])}")
                text += [f"  - `{json.dumps(x)}`" for x in rep["lines"]]
            text.append("")
    text += ["## Files", "",
             "- `runs/<row>/rep<r>/`: each run's `rank<r>.h5` (layout: `include/gpt2p/io/run_record.h`) "
             "or pp_plan's `plan.json`",
             "- `logs/<row>.rep<r>.log`: each run's command line and output",
             "- `anchors/<anchor>.rep<r>.jsonl` (and `.err`): each anchor's output",
             "- `rows.tsv`, `anchors.tsv`: what ran, exit codes and wall times", ""]
    return "\n".join(text)
