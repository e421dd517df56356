"""Probe: which GPU kernels make a small fp32 micro-batch cost more per sequence than a large one?
Profiles 6 GPT-2 blocks forward+backward at 8 and 64 rows (sequence 128) and prints each kernel's
GPU time per row. Usage: python3 kernel_probe.py [path to scripts/peers]"""
import sys, collections, torch
from torch.profiler import profile, ProfilerActivity
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else "../../scripts/peers")
from nanogpt import Block

torch.manual_seed(0)
S, D, H, L, ITERS = 128, 768, 12, 6, 10
per_row = {}
for rows in (8, 64):
    stage = torch.nn.Sequential(*[Block(D, H) for _ in range(L)]).cuda()
    x = torch.randn(rows, S, D, device="cuda", requires_grad=True)
    g = torch.randn(rows, S, D, device="cuda")
    for _ in range(3):
        stage(x).backward(g)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(ITERS):
            stage(x).backward(g)
        torch.cuda.synchronize()
    acc = collections.Counter()
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if e.key.startswith("aten::") or t == 0:
            continue
        acc[e.key[:90]] += t / 1e3 / ITERS / rows  # ms per row per step
    per_row[rows] = acc
keys = sorted(set(per_row[8]) | set(per_row[64]), key=lambda k: -per_row[8].get(k, 0))
print(f"{'kernel':90s} {'ms/row@8':>9s} {'ms/row@64':>9s}")
for k in keys[:25]:
    print(f"{k:90s} {per_row[8].get(k, 0):9.4f} {per_row[64].get(k, 0):9.4f}")
print(f"{'TOTAL':90s} {sum(per_row[8].values()):9.4f} {sum(per_row[64].values()):9.4f}")
