"""Why is pp_train's split backward (deferred_linear) faster than the plain one under bf16
autocast? Times GPT-2 124M's 12 blocks (forward + backward, B x T tokens, bf16 autocast) with the
blocks' four linear layers as
  plain    torch.nn.functional.linear under autocast (what GPT2Impl runs without --zero-bubble)
  fn       an autograd Function that casts to bf16 itself and computes dW = dy^T x in backward
           (deferred_linear's arithmetic, W run right away)
  fn_xtdy  the same Function with dW = (x^T dy)^T, the orientation autograd's mm backward uses
and the weight-gradient GEMM alone in both orientations; then the top kernels of plain and fn
under torch.profiler.
usage: python3 linear_probe.py [--batch 16] [--seq 1024] [--dtype bf16|fp32]"""
import argparse
import torch
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=16)
p.add_argument("--seq", type=int, default=1024)
p.add_argument("--dtype", default="bf16")
p.add_argument("--iters", type=int, default=20)
a = p.parse_args()
dev = "cuda"
C, H, L = 768, 12, 12
bf16 = a.dtype == "bf16"
cdt = torch.bfloat16 if bf16 else torch.float32


class FnLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, xtdy):
        xc, wc, bc = x.to(cdt), w.to(cdt), b.to(cdt)
        ctx.save_for_backward(xc, wc)
        ctx.xtdy, ctx.xdt = xtdy, x.dtype
        return F.linear(xc, wc, bc)

    @staticmethod
    def backward(ctx, dy):
        xc, wc = ctx.saved_tensors
        dy = dy.to(cdt)
        dx = dy.matmul(wc).to(ctx.xdt)
        d2, x2 = dy.reshape(-1, dy.shape[-1]), xc.reshape(-1, xc.shape[-1])
        dw = x2.t().mm(d2).t() if ctx.xtdy else d2.t().mm(x2)
        return dx, dw.float(), d2.sum(0).float(), None


def make():
    torch.manual_seed(0)
    ps = []
    for _ in range(L):
        blk = {}
        for name, (o, i) in {"qkv": (3 * C, C), "proj": (C, C), "fc": (4 * C, C), "out": (C, 4 * C)}.items():
            blk[name] = (torch.randn(o, i, device=dev) * 0.02).requires_grad_(), torch.zeros(o, device=dev, requires_grad=True)
        blk["ln1"] = (torch.ones(C, device=dev, requires_grad=True), torch.zeros(C, device=dev, requires_grad=True))
        blk["ln2"] = (torch.ones(C, device=dev, requires_grad=True), torch.zeros(C, device=dev, requires_grad=True))
        ps.append(blk)
    return ps


def run(ps, x, mode):
    def lin(h, wb):
        if mode == "plain":
            return F.linear(h, *wb)
        return FnLinear.apply(h, wb[0], wb[1], mode == "fn_xtdy")
    B, T = x.shape[0], x.shape[1]
    for blk in ps:
        h = F.layer_norm(x, (C,), *blk["ln1"])
        q, k, v = lin(h, blk["qkv"]).split(C, dim=2)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + lin(y, blk["proj"])
        h = F.layer_norm(x, (C,), *blk["ln2"])
        x = x + lin(F.gelu(lin(h, blk["fc"]), approximate="tanh"), blk["out"])
    return x


def step(ps, x, mode):
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        out = run(ps, x, mode)
    out.float().pow(2).mean().backward()


def timed(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / iters


ps = make()
x0 = torch.randn(a.batch, a.seq, C, device=dev)
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {a.dtype}, {a.batch} x {a.seq}")
res = {}
for mode in ("plain", "fn", "fn_xtdy", "plain", "fn"):
    res.setdefault(mode, []).append(timed(lambda: step(ps, x0, mode), a.iters))
for mode, ts in res.items():
    print(f"blocks fwd+bwd {mode:8s} " + " ".join(f"{t:8.3f}" for t in ts) + " ms")
N = a.batch * a.seq
for o, i in ((3 * C, C), (C, C), (4 * C, C), (C, 4 * C)):
    dy = torch.randn(N, o, device=dev, dtype=cdt)
    xx = torch.randn(N, i, device=dev, dtype=cdt)
    t1 = timed(lambda: dy.t().mm(xx), 50)
    t2 = timed(lambda: xx.t().mm(dy).t(), 50)
    t3 = timed(lambda: dy.mm(torch.randn(o, i, device=dev, dtype=cdt)), 50)
    print(f"GEMM dW [{o}x{i}] over {N}: dy^T x {t1 * 1e3:8.1f} us   (x^T dy)^T {t2 * 1e3:8.1f} us   dx-like {t3 * 1e3:8.1f} us")
from torch.profiler import profile, ProfilerActivity
for mode in ("plain", "fn"):
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            step(ps, x0, mode)
        torch.cuda.synchronize()
    print(f"==== {mode}: top CUDA kernels over 3 steps")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=70))
