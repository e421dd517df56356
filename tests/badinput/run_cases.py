#!/usr/bin/env python3
"""Runs the bad-input table (cases.tsv): each case's command must end on its own, within its time
limit, with the expected exit status and a stderr that says what is wrong, and leave the
directory it guards exactly as it was. Python standard library only.

  run_cases.py --bin build                     every case
  run_cases.py --bin build --only 'resume|neg-' the cases whose names match
  run_cases.py --list                          the case names
Options: --data FILE (default: .cache/data/ding-gpt2.h5 when present, else made with
prepare_data in the temporary directory), --keep (keep the temporary directory), --json-out FILE.
Exit status: 0 all selected cases passed (or were skipped), 1 some failed, 2 bad usage.
"""

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TINY = "--preset tiny --device cpu"
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
    "OMP_NUM_THREADS": "1",
}


class Skip(Exception):
    pass


class FixtureError(Exception):
    pass


def read_cases(path):
    cases = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        cols = line.split("\t")
        if len(cols) != 7:
            sys.exit(f"{path}:{n}: {len(cols)} tab-separated columns, expected 7")
        name, rc, secs, setup, guard, pattern, command = cols
        cases.append({"name": name, "rc": rc, "secs": float(secs),
                      "setup": [] if setup == "-" else re.split(r",(?=[a-z_]+(?:=|,|$))", setup),
                      "guard": None if guard == "-" else guard, "stderr": pattern,
                      "command": command, "line": n})
    names = [c["name"] for c in cases]
    dups = {x for x in names if names.count(x) > 1}
    if dups:
        sys.exit(f"{path}: duplicate case names {sorted(dups)}")
    return cases


def run_group(cmd, cwd, env, limit):
    """Runs cmd (bash) in its own process group; returns (rc, stdout, stderr, seconds, hung)."""
    start = time.monotonic()
    p = subprocess.Popen(["bash", "-c", cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, errors="replace",
                         start_new_session=True)
    hung = False
    try:
        out, err = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        hung = True
        kill_group(p.pid)
        out, err = p.communicate()
    secs = time.monotonic() - start
    kill_group(p.pid)  # anything the command left behind in its group
    return p.returncode, out, err, secs, hung


def kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def snapshot(d):
    """Every entry under d: path -> (kind, mode, sha256 of the bytes for files)."""
    d = Path(d)
    if not d.exists():
        return None
    snap = {}
    for p in sorted(d.rglob("*")):
        rel = str(p.relative_to(d))
        st = p.lstat()
        if stat.S_ISREG(st.st_mode):
            snap[rel] = ("file", stat.S_IMODE(st.st_mode), hashlib.sha256(p.read_bytes()).hexdigest())
        else:
            snap[rel] = ("dir" if p.is_dir() else "other", stat.S_IMODE(st.st_mode), "")
    return snap


def diff_snapshots(a, b):
    if a is None or b is None:
        return [] if a == b else ["the directory " + ("appeared" if a is None else "vanished")]
    out = []
    for k in sorted(set(a) | set(b)):
        if k not in b:
            out.append(f"removed {k}")
        elif k not in a:
            out.append(f"added {k}")
        elif a[k] != b[k]:
            out.append(f"changed {k}")
    return out


class Fixtures:
    """The dataset and the two trained runs, made once and only when a case needs them."""

    def __init__(self, bindir, tmp, data, env):
        self.bin, self.tmp, self.env = bindir, Path(tmp), env
        self._data = data
        self._runs = {}
        self._failed = {}

    def data(self):
        if self._data is None:
            if "data" in self._failed:
                raise FixtureError(self._failed["data"])
            out = self.tmp / "fixtures" / "ding-gpt2.h5"
            out.parent.mkdir(parents=True, exist_ok=True)
            vocab = self.env.get("GPT2P_VOCAB_DIR", str(ROOT / ".cache" / "gpt2-vocab"))
            rc, so, se, secs, hung = run_group(
                f"{self.bin}/prepare_data --out {out} --vocab-dir {shlex.quote(vocab)}", self.tmp,
                self.env, 300)
            if rc != 0:
                self._failed["data"] = f"prepare_data failed (rc {rc}): {tail(se or so)}"
                raise FixtureError(self._failed["data"])
            self._data = str(out)
        return self._data

    def run(self, kind):
        """A finished 2-step run of dp_train (1 rank) or pp_train (2 stages) with a checkpoint."""
        if kind in self._failed:
            raise FixtureError(self._failed[kind])
        if kind not in self._runs:
            out = self.tmp / "fixtures" / kind
            prog = {"dp": f"{self.bin}/dp_train", "pp": f"mpirun -np 2 {self.bin}/pp_train"}[kind]
            cmd = (f"{prog} {TINY} --max-train-pairs 128 --data {self.data()} --out {out} "
                   f"--max-steps 2 --save-every 1 --translate-samples 0")
            rc, so, se, secs, hung = run_group(cmd, self.tmp, self.env, 300)
            meta = out / "checkpoint" / ("meta.json" if kind == "dp" else "stage0/meta.json")
            if rc != 0 or not meta.exists():
                self._failed[kind] = (f"the {kind} fixture run failed (rc {rc}"
                                      f"{', hung' if hung else ''}, {meta.name} "
                                      f"{'present' if meta.exists() else 'missing'}): {cmd}\n"
                                      f"{tail(se or so)}")
                raise FixtureError(self._failed[kind])
            self._runs[kind] = out
        return self._runs[kind]


def tail(text, n=15):
    lines = (text or "").strip().splitlines()
    return "\n".join(lines[-n:])


def make_readonly(d):
    d.mkdir(parents=True)
    d.chmod(0o555)
    if os.geteuid() == 0:  # root writes through permissions: make it immutable instead
        r = subprocess.run(["chattr", "+i", str(d)], capture_output=True, text=True)
        if r.returncode != 0:
            raise Skip(f"root cannot make {d} unwritable (chattr +i: {r.stderr.strip()})")
    try:
        (d / ".probe").write_text("x")
    except OSError:
        return
    raise Skip(f"{d} stays writable")


def release_readonly(w):
    for d in w.rglob("*"):
        if d.is_dir() and not d.is_symlink():
            subprocess.run(["chattr", "-i", str(d)], capture_output=True)
            try:
                d.chmod(0o755)
            except OSError:
                pass


def flip_middle(p, n=64):
    data = bytearray(p.read_bytes())
    mid = len(data) // 2
    for i in range(mid, min(mid + n, len(data))):
        data[i] ^= 0xFF
    p.write_bytes(bytes(data))


def reseal(path):
    """Writes the dataset's checksum block anew for its edited content, as a crafted file would
    carry it: the checks after HDF5 has opened the file are the ones under test."""
    data = bytearray(Path(path).read_bytes())
    h = 14695981039346656037
    for b in memoryview(data)[512:]:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    line = f"gpt2p-dataset 1 fnv1a64 {h:016x} bytes {len(data) - 512}\n".encode()
    data[:512] = line + bytes(512 - len(line))
    Path(path).write_bytes(bytes(data))


def edit_with_h5py(code, src, dst, what, *args):
    """Runs `code` (argv: src, dst, args) with the Python that has h5py (scripts/setup installs
    it), then writes dst's checksum block anew (reseal)."""
    for py in (os.environ.get("GPT2P_PYTHON"), str(ROOT / "scripts" / "python"), "python3"):
        if not py:
            continue
        r = subprocess.run([py, "-c", code, src, str(dst), *args], capture_output=True, text=True)
        if r.returncode == 0:
            reseal(dst)
            return
    raise Skip(f"no python3 with h5py to write {what}")


def make_bad_tokens(src, dst, token=60000):
    """A copy of the dataset whose first 128 training pairs each start with `token` (60000: outside
    the vocabulary of 50260; 100: inside it, the data merely differs): built by the Python that has
    h5py (scripts/setup installs it)."""
    code = (
        "import shutil, sys, h5py\n"
        "shutil.copyfile(sys.argv[1], sys.argv[2])\n"
        "f = h5py.File(sys.argv[2], 'r+')\n"
        "t, off = f['train/tokens'], f['train/offsets'][:]\n"
        "tok = int(sys.argv[3])\n"
        "assert tok == 100 or int(f.attrs['vocab_size']) < tok\n"
        "for i in range(min(128, len(off) - 1)):\n"
        "    t[int(off[i])] = tok\n"
        "f.close()\n")
    edit_with_h5py(code, src, dst, "a dataset with other token ids", str(token))


DEEP = 100000  # levels of nesting in the crafted JSON: far past any stack a recursive copy has


def deep_json(depth=DEEP):
    return "[" * depth + "]" * depth


def update_checksum(path):
    """After path (a checkpoint file) changed: its size and CRC-32 in the meta.json beside it, so
    that only the crafted content, not a checksum, can refuse it."""
    meta_path = path.parent / "meta.json"
    meta = json.loads(meta_path.read_text())
    if path.name in meta.get("files", {}):
        data = path.read_bytes()
        meta["files"][path.name] = {"bytes": len(data), "crc32": f"{zlib.crc32(data):08x}"}
        meta_path.write_text(json.dumps(meta, indent=1))


def deep_safetensors_header(path):
    """The safetensors file with an array nested DEEP levels in its header's __metadata__."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    text = json.dumps(header, separators=(",", ":"))
    text = text[:-1] + ',"__metadata__":{"x":' + deep_json() + "}}"
    text += " " * ((8 - len(text) % 8) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text.encode() + data[8 + n:])
    update_checksum(path)


def make_float_tokens(src, dst):
    """A copy of the dataset whose train/tokens are stored as float32 (the same ids)."""
    code = (
        "import shutil, sys, h5py\n"
        "shutil.copyfile(sys.argv[1], sys.argv[2])\n"
        "f = h5py.File(sys.argv[2], 'r+')\n"
        "t = f['train/tokens'][:]\n"
        "del f['train/tokens']\n"
        "f['train'].create_dataset('tokens', data=t.astype('float32'))\n"
        "f.close()\n")
    edit_with_h5py(code, src, dst, "a dataset with float token ids")


def make_empty_validation(src, dst):
    """A copy of the dataset whose validation split holds no pairs (consistent, checksum made
    anew)."""
    code = (
        "import shutil, sys, h5py, numpy as np\n"
        "shutil.copyfile(sys.argv[1], sys.argv[2])\n"
        "f = h5py.File(sys.argv[2], 'r+')\n"
        "g = f['validation']\n"
        "for name, data in (('tokens', np.zeros(0, 'int32')), ('offsets', np.zeros(1, 'int64')),\n"
        "                   ('src_lengths', np.zeros(0, 'int32'))):\n"
        "    del g[name]\n"
        "    g.create_dataset(name, data=data)\n"
        "for name in ('text_de', 'text_en'):\n"
        "    del g[name]\n"
        "    g.create_dataset(name, shape=(0,), dtype=h5py.string_dtype())\n"
        "f.attrs['n_validation'] = 0\n"
        "f.close()\n")
    edit_with_h5py(code, src, dst, "a dataset with an empty validation split")


def prepare(case, w, fx):
    for action in case["setup"]:
        key, _, arg = action.partition("=")
        if key == "out":
            (w / "out").mkdir()
            (w / "out" / "notes.txt").write_text("this directory existed before the run\n")
        elif key in ("dp_ckpt", "pp_ckpt"):
            shutil.copytree(fx.run(key[:2]), w / "run")
        elif key == "truncate":
            p = w / "run" / arg
            p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
        elif key == "flip":
            flip_middle(w / "run" / arg)
        elif key == "readonly":
            make_readonly(w / arg)
        elif key == "bad_tokens":
            make_bad_tokens(fx.data(), w / "bad.h5")
        elif key == "data_flip":  # $W/flipped.h5: the dataset with bytes in its middle inverted
            shutil.copyfile(fx.data(), w / "flipped.h5")
            flip_middle(w / "flipped.h5")
        elif key == "data_craft":  # data_craft=N: $W/crafted.h5, 64 bytes from N inverted, resealed
            data = bytearray(Path(fx.data()).read_bytes())
            at = len(data) // 2 if arg == "middle" else int(arg)
            for i in range(at, min(at + 64, len(data))):
                data[i] ^= 0xFF
            (w / "crafted.h5").write_bytes(bytes(data))
            reseal(w / "crafted.h5")
        elif key == "empty_validation":
            make_empty_validation(fx.data(), w / "empty.h5")
        elif key == "float_tokens":
            make_float_tokens(fx.data(), w / "float.h5")
        elif key == "other_tokens":
            make_bad_tokens(fx.data(), w / "other.h5", token=100)
        elif key == "deep_header":  # deep_header=P: $W/run/P's header nests DEEP levels
            deep_safetensors_header(w / "run" / arg)
        elif key == "deep_json":  # deep_json=P: $W/P is one JSON array nested DEEP levels
            (w / arg).parent.mkdir(parents=True, exist_ok=True)
            (w / arg).write_text(deep_json())
        elif key == "deep_line":  # deep_line=P: $W/P is one JSON line {"ids": <nested DEEP>}
            (w / arg).write_text('{"ids": ' + deep_json() + "}\n")
        elif key == "vocab":  # $W/vocab: a copy of the GPT-2 vocabulary
            shutil.copytree(Path(fx.env.get("GPT2P_VOCAB_DIR", ROOT / ".cache" / "gpt2-vocab")),
                            w / "vocab")
        elif key == "meta_edit":  # meta_edit=P:KEY:JSON: $W/run/P's KEY set to the JSON value
            rel, field, value = arg.split(":", 2)
            meta = json.loads((w / "run" / rel).read_text())
            meta[field] = json.loads(value)
            (w / "run" / rel).write_text(json.dumps(meta, indent=1))
        elif key == "meta_drop":  # meta_drop=P:KEY: KEY removed from $W/run/P
            rel, field = arg.split(":", 1)
            meta = json.loads((w / "run" / rel).read_text())
            meta.pop(field, None)
            (w / "run" / rel).write_text(json.dumps(meta, indent=1))
        elif key == "devzero":  # devzero=P: $W/run/P becomes a symbolic link to /dev/zero
            (w / "run" / arg).unlink()
            (w / "run" / arg).symlink_to("/dev/zero")
        else:
            raise SystemExit(f"case {case['name']}: unknown setup '{action}'")


def check_rc(expected, rc):
    if expected == "fail":
        return 1 <= rc <= 125 and rc != 75
    return rc == int(expected)


def run_case(case, fx, bindir, tmp, env):
    w = Path(tmp) / "cases" / case["name"]
    w.mkdir(parents=True)
    res = {"name": case["name"], "expected_rc": case["rc"]}
    try:
        try:
            prepare(case, w, fx)
            needs_data = "$D" in case["command"]
            data = fx.data() if needs_data else ""
        except Skip as e:
            return {**res, "status": "SKIP", "why": [str(e)]}
        except FixtureError as e:
            return {**res, "status": "FAIL", "why": [str(e)]}
        except OSError as e:  # e.g. the fixture run lacks the file a case corrupts
            return {**res, "status": "FAIL", "why": [f"setup {','.join(case['setup'])}: {e}"]}
        guard = w / case["guard"] if case["guard"] else None
        before = snapshot(guard) if guard else None
        cenv = dict(env, BIN=str(bindir), D=data, W=str(w), T=f"{TINY} --max-train-pairs 128",
                    TB=TINY)
        rc, out, err, secs, hung = run_group(case["command"], w, cenv, case["secs"])
        res.update(rc=rc, seconds=round(secs, 1))
        why = []
        if hung:
            why.append(f"no exit within {case['secs']:.0f} s: killed (a hang)")
        elif not check_rc(case["rc"], rc):
            why.append(f"exit status {rc}, expected {case['rc']}")
        if not re.search(case["stderr"], err, re.IGNORECASE):
            why.append(f"stderr does not match /{case['stderr']}/")
        if guard:
            changes = diff_snapshots(before, snapshot(guard))
            if changes:
                why.append(f"{case['guard']}/ was changed: " + ", ".join(changes[:6]) +
                           (f" (+{len(changes) - 6} more)" if len(changes) > 6 else ""))
        res["status"] = "FAIL" if why else "PASS"
        res["why"] = why
        if why:
            res["stderr_tail"] = tail(err, 8)
        return res
    finally:
        release_readonly(w)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=str(ROOT / "build"), help="directory with the programs")
    ap.add_argument("--cases", default=str(HERE / "cases.tsv"))
    ap.add_argument("--data", help="a prepared dataset (default: .cache/data/ding-gpt2.h5 or a new one)")
    ap.add_argument("--only", help="run the cases whose names match this regular expression")
    ap.add_argument("--list", action="store_true", help="print the case names and exit")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--json-out", help="also write the results here")
    a = ap.parse_args()
    cases = read_cases(a.cases)
    if a.only:
        cases = [c for c in cases if re.search(a.only, c["name"])]
    if a.list:
        print("\n".join(c["name"] for c in cases))
        return 0
    bindir = Path(a.bin).resolve()
    for prog in ("dp_train", "pp_train", "comm_bench", "prepare_data"):
        if not os.access(bindir / prog, os.X_OK):
            print(f"run_cases: {bindir / prog} is missing: build it first", file=sys.stderr)
            return 2
    data = a.data
    cached = ROOT / ".cache" / "data" / "ding-gpt2.h5"
    # Only a dataset this prepare_data writes (its checksum block); an older one is made anew.
    if data is None and cached.is_file() and cached.read_bytes()[:16] == b"gpt2p-dataset 1 ":
        data = str(ROOT / ".cache" / "data" / "ding-gpt2.h5")
    env = dict(os.environ)
    for k, v in MPI_ENV.items():
        env.setdefault(k, v)
    # The cases run in their own directories: the vocabulary by its absolute path.
    env.setdefault("GPT2P_VOCAB_DIR", str(ROOT / ".cache" / "gpt2-vocab"))
    tmp = tempfile.mkdtemp(prefix="gpt2p-badinput-")
    fx = Fixtures(bindir, tmp, str(Path(data).resolve()) if data else None, env)
    results = []
    try:
        for c in cases:
            r = run_case(c, fx, bindir, tmp, env)
            results.append(r)
            extra = f" (exit {r['rc']}, {r['seconds']} s)" if "rc" in r else ""
            print(f"{r['status']:4} {c['name']}{extra}", flush=True)
            for why in r.get("why", []):
                print("       " + why.replace("\n", "\n       "), flush=True)
            if r["status"] == "FAIL" and r.get("stderr_tail"):
                print("       stderr: " + r["stderr_tail"].replace("\n", "\n               "), flush=True)
    finally:
        if a.keep:
            print(f"run_cases: kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    counts = {s: sum(r["status"] == s for r in results) for s in ("PASS", "FAIL", "SKIP")}
    print(f"badinput: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped"
          f" of {len(results)}")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(results, indent=2) + "\n")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
