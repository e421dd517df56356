import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


def load_json(path):
    return json.loads(Path(path).read_text())


# Synthetic pp_train runs of D data-parallel replicas of a P-rank pipeline (pp_train --dp D): the
# rank files' layout (include/gpt2p/io/run_record.h) with hand-chosen times, small enough to check
# the metrics by hand. Times are in units of U seconds; step k starts at k * PERIOD units.
U = 0.01
PERIOD = 20
F, B, SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD, OPT = range(7)

# 1F1B on P = 2 ranks, M = 2 micro-batches, forward 1 unit, backward 2: per pipeline rank, rows
# (op, micro-batch, start, end); each rank then runs the optimizer from its last row until
# OPT_END. Compute (F, B) is 6 units on each rank, 12 per replica.
SCHEDULE_1F1B_P2_M2 = {
    0: [(F, 0, 0, 1), (SEND_ACT, 0, 1, 1.1), (F, 1, 1, 2), (SEND_ACT, 1, 2, 2.1),
        (RECV_GRAD, 0, 2.1, 4), (B, 0, 4, 6), (RECV_GRAD, 1, 6, 7), (B, 1, 7, 9)],
    1: [(RECV_ACT, 0, 0, 1), (F, 0, 1, 2), (RECV_ACT, 1, 2, 2.1), (B, 0, 2, 4),
        (SEND_GRAD, 0, 4, 4.1), (F, 1, 4, 5), (B, 1, 5, 7), (SEND_GRAD, 1, 7, 7.1)],
}
# When the optimizer ends (units after the step's start) per replica: replica 1's takes longer,
# and step 0 (left out of the measured bubble) 5 units more on both.
OPT_END = {0: 9.5, 1: 11.0}
FIRST_STEP_EXTRA = 5.0
# Each rank's clock starts elsewhere (seconds added to all of its times).
CLOCK_SHIFT = [0.0, 0.25, -0.125, 0.5]


def write_rank_file(path, attrs, tables):
    """One timing file: root attributes and /steps, /epochs, /actions of float64 columns."""
    import h5py
    import numpy as np

    with h5py.File(path, "w") as f:
        for k, v in attrs.items():
            f.attrs[k] = v
        for name, columns in tables.items():
            g = f.create_group(name)
            for column, values in columns.items():
                g.create_dataset(column, data=np.asarray(values, dtype=np.float64), maxshape=(None,))


def interleaved_rows(p, n, v, m):
    """A simple schedule for V stages per rank: all forwards (1 unit), then all backwards (2), as
    (op, micro-batch, start, end, stage) rows."""
    rows, t = [], 0.0
    for op, dur in ((F, 1.0), (B, 2.0)):
        for c in range(v):
            for mb in range(m):
                rows.append((op, mb, t, t + dur, p + c * n))
                t += dur
    return rows


def write_pipeline_run(directory, dp=2, pp=2, stages_per_rank=1, microbatches=2, steps=3,
                       tokens_per_sec=(320.0, 300.0), hybrid_attrs=True):
    """Writes rank0.h5 .. rank<D P - 1>.h5 of a pp_train --dp D run into `directory`: world rank r
    is pipeline rank r % P of replica r // P. With stages_per_rank 1, P = 2 and M = 2 the actions
    are SCHEDULE_1F1B_P2_M2; otherwise interleaved_rows. `tokens_per_sec` is each replica's
    epoch throughput (all of its ranks record it). hybrid_attrs=False leaves out the dp/pp
    attributes and the config's "dp", as files written before --dp."""
    import json
    from pathlib import Path

    import numpy as np

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    world = dp * pp
    v, m = stages_per_rank, microbatches
    config = {"batch_size": 4 * dp, "seq_len": 16, "epochs": 1, "warmup_epochs": 0,
              "microbatches": m, "mode": "pipeline",
              "schedule": "interleaved" if v > 1 else "1f1b", "stages_per_rank": v,
              "partition": "balanced", "zero_bubble": False, "zb_extra_live": 0}
    if hybrid_attrs:
        config["dp"] = dp
    for r in range(world):
        d, p = divmod(r, pp)
        shift = CLOCK_SHIFT[r % len(CLOCK_SHIFT)]
        if v == 1 and pp == 2 and m == 2:
            rows = [(op, mb, s, e, p) for op, mb, s, e in SCHEDULE_1F1B_P2_M2[p]]
            opt_end = OPT_END[d % 2]
        else:
            rows = interleaved_rows(p, pp, v, m)
            opt_end = rows[-1][3] + 0.5
        act = {c: [] for c in ("step", "stage", "op", "microbatch", "start", "end",
                               "bytes_sent", "bytes_recv")}
        st = {c: [] for c in ("step", "epoch", "start", "end", "data", "forward", "backward",
                              "sync_exposed", "sync_total", "optimizer", "loss", "lr",
                              "padded_tokens", "target_tokens")}
        for k in range(steps):
            t0 = k * PERIOD
            extra = FIRST_STEP_EXTRA if k == 0 else 0.0
            last = max(e for _, _, _, e, _ in rows)
            for op, mb, s, e, stage in rows + [(OPT, 0, last, opt_end + extra, p)]:
                act["step"].append(k)
                act["stage"].append(stage)
                act["op"].append(op)
                act["microbatch"].append(mb)
                act["start"].append((t0 + s) * U + shift)
                act["end"].append((t0 + e) * U + shift)
                act["bytes_sent"].append(4096.0 if op in (SEND_ACT, SEND_GRAD) else 0.0)
                act["bytes_recv"].append(4096.0 if op in (RECV_ACT, RECV_GRAD) else 0.0)
            # Every rank leaves the step together (the loss is reduced over all of them).
            for c, x in (("step", k), ("epoch", 0), ("start", t0 * U + shift),
                         ("end", (t0 + 17) * U + shift), ("data", 0.0), ("forward", 2 * U),
                         ("backward", 4 * U), ("sync_exposed", 0.0), ("sync_total", 0.0),
                         ("optimizer", 0.5 * U), ("loss", 5.0 - 0.25 * k), ("lr", 1e-4),
                         ("padded_tokens", 64.0), ("target_tokens", 60.0)):
                st[c].append(x)
        epochs = {"epoch": [0], "train_time": [steps * PERIOD * U],
                  "tokens_per_sec": [tokens_per_sec[d % len(tokens_per_sec)]],
                  "target_tokens_per_sec": [0.9 * tokens_per_sec[d % len(tokens_per_sec)]],
                  "padded_tokens": [64.0 * steps], "val_loss": [4.5 + 0.1 * p],
                  "val_ppl": [float(np.exp(4.5 + 0.1 * p))], "bleu": [0.0],
                  "peak_memory_bytes": [1e8]}
        attrs = {"program": "pp_train", "rank": r, "world_size": world,
                 "config": json.dumps(config), "device": "cpu", "host": "synthetic",
                 "stage": float(p), "stages_per_rank": float(v), "microbatches": float(m)}
        if hybrid_attrs:
            attrs.update(dp=float(dp), dp_rank=float(d), pp=float(pp), pp_rank=float(p))
        write_rank_file(directory / f"rank{r}.h5", attrs,
                        {"steps": st, "epochs": epochs, "actions": act})
    return directory


@pytest.fixture
def hybrid_2x2(tmp_path) -> Path:
    """A 2 x 2 hybrid 1F1B run (SCHEDULE_1F1B_P2_M2 on both replicas, 3 steps)."""
    return write_pipeline_run(tmp_path / "hybrid_2x2")
