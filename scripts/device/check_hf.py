#!/usr/bin/env python3
"""Checks gpt2_eval against Hugging Face transformers on a random-init GPT-2 (124M), in true fp32.

usage: check_hf.py PATH/TO/gpt2_eval [--no-cpu]

Builds GPT2LMHeadModel(GPT2Config()), saves it with save_pretrained (safetensors), writes a few
random id sequences, and compares HF's loss (labels=input_ids, pooled over every predicted token
of every sequence, as gpt2_eval defines it) and the first sequence's logits with gpt2_eval's, on
cuda and (unless --no-cpu) cpu. Tolerances: loss relative diff <= 1e-5, logits max abs diff <= 1e-4.
Prints one summary line; exits 1 on failure.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel

LOSS_RTOL = 1e-5
LOGITS_ATOL = 1e-4
LENGTHS = [64, 17, 128, 5]


def hf_reference(model, seqs, device):
    model = model.to(device)
    total, tokens = 0.0, 0
    first_logits = None
    with torch.no_grad():
        for i, ids in enumerate(seqs):
            x = torch.tensor([ids], dtype=torch.long, device=device)
            out = model(input_ids=x, labels=x)
            n = len(ids) - 1
            total += out.loss.double().item() * n  # HF's loss is the mean over n predictions
            tokens += n
            if i == 0:
                first_logits = out.logits[0].float().cpu().numpy()
    return total / tokens, tokens, first_logits


def run_ours(binary, ckpt, ids_path, workdir, device):
    dump = os.path.join(workdir, f"logits_{device}.bin")
    cmd = [binary, "--checkpoint", ckpt, "--ids-jsonl", ids_path, "--dump-logits", dump,
           "--device", device, "--precision", "fp32"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    out = json.loads(res.stdout)
    with open(dump + ".json") as f:
        shape = json.load(f)["shape"]
    logits = np.fromfile(dump, dtype="<f4").reshape(shape)
    return out, logits


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    binary = os.path.abspath(sys.argv[1])
    devices = ["cuda"] + ([] if "--no-cpu" in sys.argv[2:] else ["cpu"])
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1234)

    config = GPT2Config()  # 124M: 12 layers, 12 heads, 768 wide, 1024 positions, 50257 tokens
    model = GPT2LMHeadModel(config).eval().float()
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, config.vocab_size, size=n).tolist() for n in LENGTHS]

    failures = []
    summary = []
    with tempfile.TemporaryDirectory() as work:
        ckpt = os.path.join(work, "hf")
        model.save_pretrained(ckpt, safe_serialization=True)
        ids_path = os.path.join(work, "ids.jsonl")
        with open(ids_path, "w") as f:
            for s in seqs:
                f.write(json.dumps({"ids": s}) + "\n")
        for device in devices:
            if device == "cuda" and not torch.cuda.is_available():
                failures.append("cuda requested but torch.cuda.is_available() is False")
                continue
            ref_loss, ref_tokens, ref_logits = hf_reference(model, seqs, device)
            out, logits = run_ours(binary, ckpt, ids_path, work, device)
            rel = abs(out["loss"] - ref_loss) / abs(ref_loss)
            if logits.shape != ref_logits.shape:
                failures.append(f"{device}: logits shape {logits.shape} vs HF {ref_logits.shape}")
                continue
            max_abs = float(np.abs(logits - ref_logits).max())
            summary.append(f"{device}: loss ours {out['loss']:.7f} HF {ref_loss:.7f} rel {rel:.2e}, "
                           f"logits max|diff| {max_abs:.2e}")
            if out["tokens"] != ref_tokens:
                failures.append(f"{device}: tokens {out['tokens']} vs HF {ref_tokens}")
            if rel > LOSS_RTOL:
                failures.append(f"{device}: loss rel diff {rel:.2e} > {LOSS_RTOL}")
            if max_abs > LOGITS_ATOL:
                failures.append(f"{device}: logits max abs diff {max_abs:.2e} > {LOGITS_ATOL}")

    status = "FAIL" if failures else "OK"
    print(f"check_hf {status}: " + "; ".join(summary + failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
