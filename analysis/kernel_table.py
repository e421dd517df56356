#!/usr/bin/env python3
"""Per-kernel breakdown of a training step from a Chrome trace written by `--profile DIR`
(libtorch's profiler, Kineto): where the GPU's time goes, by kind of work and by kernel.

usage: kernel_table.py TRACE.json [--steps N] [--top K] [--json OUT]

  --steps N   steps the trace covers (the trainers' --profile-steps; default 3): times are per step
  --top K     kernels listed one by one (default 25)

Prints: the span of GPU activity per step, GPU busy time per step (sum of kernel, copy and memset
times; the rest of the span is idle GPU, mostly waiting for the host), then milliseconds per step
for each kind of work (GEMM, attention, the LM head's cross-entropy kernel, LayerNorm, GELU, other
elementwise, reductions, optimizer, communication, copies), then the top kernels.
"""
import argparse
import collections
import json
import re
import sys

# (kind, pattern on the kernel's name), first match wins.
KINDS = [
    ("communication", r"nccl"),
    ("cross-entropy (ours)", r"softmax_cross_entropy_kernel"),
    ("attention", r"flash|fmha|attention|sdpa|cudnn.*(mha|attn)|_attn_"),
    ("optimizer", r"multi_tensor|adam"),
    ("GEMM", r"gemm|sm\d+_xmma|cutlass|nvjet|cublas|wgmma|matmul"),
    ("LayerNorm", r"layer_norm|layernorm|LayerNorm"),
    ("GELU", r"gelu|GeluCUDA"),
    ("softmax / log_softmax", r"softmax"),
    ("embedding", r"embedding|indexSelect|index_select|gather|scatter"),
    ("reduction", r"reduce_kernel|Reduce|sum_kernel"),
    ("elementwise", r"elementwise|vectorized|unrolled|Functor|fill|copy"),
]


def kind_of(name, cat):
    if cat in ("gpu_memcpy", "Memcpy"):
        return "memcpy"
    if cat in ("gpu_memset", "Memset"):
        return "memset"
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return "other"


def load_gpu_events(path):
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    gpu = []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat", "")
        if cat in ("kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"):
            gpu.append((float(e["ts"]), float(e.get("dur", 0.0)), e.get("name", "?"), cat))
    return gpu


def table(path, steps, top):
    gpu = load_gpu_events(path)
    if not gpu:
        raise SystemExit(f"{path}: no GPU kernels in the trace (was it a CPU run, or a libtorch without CUPTI?)")
    start = min(t for t, _, _, _ in gpu)
    end = max(t + d for t, d, _, _ in gpu)
    busy = sum(d for _, d, _, _ in gpu)
    by_kind = collections.Counter()
    by_name = collections.Counter()
    calls = collections.Counter()
    for _, d, name, cat in gpu:
        by_kind[kind_of(name, cat)] += d
        by_name[name] += d
        calls[name] += 1
    ms = lambda us: us / 1e3 / steps  # noqa: E731  (per step)
    out = {
        "trace": path, "steps": steps,
        "span_ms_per_step": ms(end - start), "busy_ms_per_step": ms(busy),
        "kinds": {k: ms(v) for k, v in by_kind.most_common()},
        "kernels": [{"name": n, "ms_per_step": ms(v), "calls_per_step": calls[n] / steps}
                    for n, v in by_name.most_common(top)],
    }
    return out


def print_table(t):
    print(f"# {t['trace']}: {t['steps']} step(s); per step: GPU span {t['span_ms_per_step']:.2f} ms, "
          f"busy {t['busy_ms_per_step']:.2f} ms, idle {t['span_ms_per_step'] - t['busy_ms_per_step']:.2f} ms")
    print(f"{'kind':<26} {'ms/step':>9} {'share':>7}")
    for k, v in t["kinds"].items():
        print(f"{k:<26} {v:9.3f} {100 * v / t['busy_ms_per_step']:6.1f}%")
    print(f"\n{'ms/step':>9} {'calls':>6}  kernel")
    for k in t["kernels"]:
        name = k["name"] if len(k["name"]) <= 110 else k["name"][:107] + "..."
        print(f"{k['ms_per_step']:9.3f} {k['calls_per_step']:6.0f}  {name}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.top < 1:
        print("kernel_table.py: --steps and --top must be positive", file=sys.stderr)
        return 2
    try:
        t = table(a.trace, a.steps, a.top)
    except (OSError, ValueError, KeyError) as e:
        print(f"kernel_table.py: cannot read {a.trace}: {e} -- pass a trace written by --profile", file=sys.stderr)
        return 2
    print_table(t)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(t, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
