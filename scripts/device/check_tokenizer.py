#!/usr/bin/env python3
"""Compares our GPT-2 tokenizer (the `tokenize` program) with Hugging Face and tiktoken.

    python3 scripts/device/check_tokenizer.py BUILD/tokenize [--vocab-dir DIR] [--cases FILE]

Both references are built offline from the same files as ours (DIR/encoder.json + DIR/vocab.bpe):
  * Hugging Face GPT2Tokenizer built from encoder.json and vocab.bpe under their Hugging Face names
    vocab.json and merges.txt (transformers 4.x and 5.x, see build_hf); it recognises
    <|endoftext|>, so it is compared with `tokenize --specials`;
  * tiktoken.Encoding("gpt2", GPT-2's pattern, mergeable_ranks from encoder.json mapped back to bytes,
    special_tokens={"<|endoftext|>": 50256}): encode_ordinary vs `tokenize`, encode(allowed all) vs
    `tokenize --specials`.
Also checks decode(encode(x)) == x in ours, and compares our decode of random byte-token sequences
(mostly invalid UTF-8) with both references (U+FFFD replacement).

Prints a summary line "tokenizer: N cases, HF mismatches A, tiktoken mismatches B, ..." and exits
1 on any mismatch, 2 when a reference cannot be built or our program fails.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"
SHOW = 8  # mismatches printed in full per reference


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def run_ours(binary, vocab_dir, lines, *flags):
    """Feeds JSON lines to `binary`, returns its parsed output lines."""
    proc = subprocess.run([str(binary), "--vocab-dir", str(vocab_dir), *flags],
                          input="".join(json.dumps(x) + "\n" for x in lines),
                          capture_output=True, text=True, encoding="utf-8")
    if proc.returncode != 0:
        print(f"tokenizer: {binary} {' '.join(flags)} failed (exit {proc.returncode}):\n"
              f"{proc.stderr.strip()}", file=sys.stderr)
        sys.exit(2)
    out = [json.loads(l) for l in proc.stdout.split("\n") if l]
    if len(out) != len(lines):
        print(f"tokenizer: {binary} {' '.join(flags)} wrote {len(out)} lines for {len(lines)}",
              file=sys.stderr)
        sys.exit(2)
    return out


def build_hf(vocab_dir, tmp):
    """GPT2Tokenizer from our files; ((encode, decode), None) or (None, reason).

    transformers 4.x takes vocab_file=/merges_file= (Hugging Face names of encoder.json and
    vocab.bpe); 5.x takes vocab= (dict) and merges= (list) and silently ignores the 4.x names, so
    each way is tried and a tokenizer that encodes "Hello world" to nothing is rejected.
    """
    try:
        import transformers
    except Exception as e:  # noqa: BLE001 - report any import problem
        return None, f"cannot import transformers: {e}"
    shutil.copy(vocab_dir / "encoder.json", tmp / "vocab.json")
    shutil.copy(vocab_dir / "vocab.bpe", tmp / "merges.txt")
    vocab = json.loads((tmp / "vocab.json").read_text(encoding="utf-8"))
    lines = (tmp / "merges.txt").read_text(encoding="utf-8").split("\n")
    merges = [l for i, l in enumerate(lines) if l and not (i == 0 and l.startswith("#version"))]
    ways = [
        ("vocab_file/merges_file", lambda: dict(vocab_file=str(tmp / "vocab.json"),
                                                merges_file=str(tmp / "merges.txt"))),
        ("vocab/merges as pairs", lambda: dict(vocab=dict(vocab),
                                               merges=[tuple(m.split(" ")) for m in merges])),
        ("vocab/merges as strings", lambda: dict(vocab=dict(vocab), merges=list(merges))),
    ]
    errors = []
    for name in ("GPT2Tokenizer", "GPT2TokenizerFast"):
        cls = getattr(transformers, name, None)
        if cls is None:
            continue
        for how, kwargs in ways:
            try:
                tok = cls(**kwargs())
                if not tok.encode("Hello world", add_special_tokens=False):
                    raise ValueError("encodes 'Hello world' to nothing (arguments ignored)")
            except Exception as e:  # noqa: BLE001
                errors.append(f"{name}({how}): {e}")
                continue
            print(f"# reference: transformers {transformers.__version__} {type(tok).__name__} "
                  f"({how})")
            return (lambda t: list(tok.encode(t, add_special_tokens=False)),
                    lambda ids: tok.decode(ids, clean_up_tokenization_spaces=False)), None
    return None, "cannot build a GPT-2 tokenizer: " + "; ".join(errors)


def build_tiktoken(encoder):
    try:
        import tiktoken
    except Exception as e:  # noqa: BLE001
        return None, f"cannot import tiktoken: {e}"
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    ranks = {bytes(byte_of[c] for c in tok): i for tok, i in encoder.items() if tok != EOT}
    enc = tiktoken.Encoding(name="gpt2", pat_str=PAT, mergeable_ranks=ranks,
                            special_tokens={EOT: encoder[EOT]})
    print(f"# reference: tiktoken {getattr(tiktoken, '__version__', '?')}")
    return enc, None


def compare(name, texts, ours, ref_fn):
    bad = 0
    for text, mine in zip(texts, ours):
        theirs = ref_fn(text)
        if mine != theirs:
            bad += 1
            if bad <= SHOW:
                print(f"MISMATCH {name}: {text!r}\n  ours:   {mine}\n  theirs: {theirs}")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tokenize", type=Path, help="our tokenize program")
    ap.add_argument("--vocab-dir", type=Path,
                    default=Path(os.environ.get("GPT2P_VOCAB_DIR", ROOT / ".cache/gpt2-vocab")),
                    help="encoder.json + vocab.bpe (default: $GPT2P_VOCAB_DIR or .cache/gpt2-vocab)")
    ap.add_argument("--cases", type=Path, default=ROOT / "tests/data/tokenizer_cases.jsonl",
                    help="JSON lines {\"text\": ...} (default: tests/data/tokenizer_cases.jsonl)")
    args = ap.parse_args()

    for f in (args.vocab_dir / "encoder.json", args.vocab_dir / "vocab.bpe", args.cases):
        if not f.is_file():
            print(f"tokenizer: missing {f} (run scripts/setup, or pass --vocab-dir/--cases)",
                  file=sys.stderr)
            return 2
    if not os.access(args.tokenize, os.X_OK):
        print(f"tokenizer: {args.tokenize} is not an executable (build the tokenize target)",
              file=sys.stderr)
        return 2
    with open(args.cases, encoding="utf-8", newline="\n") as f:
        texts = [json.loads(l)["text"] for l in f.read().split("\n") if l]
    encoder = json.loads((args.vocab_dir / "encoder.json").read_text(encoding="utf-8"))

    plain = [o["ids"] for o in run_ours(args.tokenize, args.vocab_dir, [{"text": t} for t in texts])]
    special = [o["ids"] for o in run_ours(args.tokenize, args.vocab_dir,
                                          [{"text": t} for t in texts], "--specials")]
    back = run_ours(args.tokenize, args.vocab_dir, [{"ids": i} for i in plain + special], "--decode")
    round_trip = 0
    for text, out in zip(texts + texts, back):
        if out["text"] != text:
            round_trip += 1
            if round_trip <= SHOW:
                print(f"ROUND-TRIP: {text!r} -> {out['text']!r}")

    # decode of byte-token sequences that are mostly not valid UTF-8
    spelling = bytes_to_unicode()
    rng = random.Random(7)
    byte_ids = [encoder[spelling[b]] for b in range(256)]
    seqs = [[rng.choice(byte_ids) for _ in range(rng.randint(1, 12))] for _ in range(200)]
    seqs += [[encoder[spelling[b]] for b in bytes.fromhex(h)]
             for h in ("c3", "e282", "f09f98", "eda080", "c0af", "f4908080", "ff41", "e282ac")]
    decoded = [o["text"] for o in run_ours(args.tokenize, args.vocab_dir,
                                           [{"ids": s} for s in seqs], "--decode")]

    status = 0
    hf_bad = tt_bad = "n/a"
    with tempfile.TemporaryDirectory() as tmp:
        hf, why = build_hf(args.vocab_dir, Path(tmp))
        if hf is None:
            print(f"tokenizer: Hugging Face reference unavailable: {why}", file=sys.stderr)
            status = 2
        else:
            encode, decode = hf
            hf_bad = compare("HF encode (ours --specials)", texts, special, encode)
            hf_bad += compare("HF decode", seqs, decoded, decode)
    enc, why = build_tiktoken(encoder)
    if enc is None:
        print(f"tokenizer: tiktoken reference unavailable: {why}", file=sys.stderr)
        status = 2
    else:
        tt_bad = compare("tiktoken encode_ordinary (ours plain)", texts, plain,
                         enc.encode_ordinary)
        tt_bad += compare("tiktoken encode all specials (ours --specials)", texts, special,
                          lambda t: enc.encode(t, allowed_special="all"))
        tt_bad += compare("tiktoken decode", seqs, decoded, enc.decode)

    print(f"tokenizer: {len(texts)} cases (+{len(seqs)} decode sequences), HF mismatches {hf_bad}, "
          f"tiktoken mismatches {tt_bad}, round-trip failures {round_trip}")
    if status == 0 and (hf_bad or tt_bad or round_trip):
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
