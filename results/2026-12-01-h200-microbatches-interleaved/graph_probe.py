"""Probe: is a pipeline stage's small micro-batch slow because of the GPU or because of the CPU?
Times 6 GPT-2 blocks (one stage of 12) forward+backward at several micro-batch rows, eager and as
CUDA graphs (torch.cuda.make_graphed_callables), plus the CPU's enqueue time of the eager step.
Usage: python3 graph_probe.py [path to scripts/peers]"""
import sys, time, json, torch
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else "../../scripts/peers")
from nanogpt import Block

torch.manual_seed(0)
dev = "cuda"
S, D, H, L = 128, 768, 12, 6


def bench(fn, iters=30, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    cpu = (time.perf_counter() - t0) / iters
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / iters
    return cpu, wall


rows_out = []
for prec in ("fp32", "bf16"):
    dt = torch.bfloat16 if prec == "bf16" else torch.float32
    for rows in (4, 8, 16, 32, 64):
        stage = torch.nn.Sequential(*[Block(D, H) for _ in range(L)]).to(dev)
        x = torch.randn(rows, S, D, device=dev, requires_grad=True)
        g = torch.randn(rows, S, D, device=dev)

        def eager():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=prec == "bf16"):
                y = stage(x)
            y.backward(g)

        cpu_e, wall_e = bench(eager)
        # autocast inside the graphed callable: cache disabled as make_graphed_callables requires
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=prec == "bf16", cache_enabled=False):
            graphed = torch.cuda.make_graphed_callables(stage, (x,))

        def replay():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=prec == "bf16", cache_enabled=False):
                y = graphed(x)
            y.backward(g)

        cpu_g, wall_g = bench(replay)
        r = dict(prec=prec, rows=rows, eager_ms=round(wall_e * 1e3, 3), eager_cpu_ms=round(cpu_e * 1e3, 3),
                 graph_ms=round(wall_g * 1e3, 3), per_row_eager_ms=round(wall_e * 1e3 / rows, 4),
                 per_row_graph_ms=round(wall_g * 1e3 / rows, 4))
        print(json.dumps(r), flush=True)
        rows_out.append(r)
        del graphed, stage
        torch.cuda.empty_cache()
