#!/usr/bin/env python3
"""Exports IWSLT14 German->English, HW5's data (the Hugging Face dataset
bbaaaa/iwslt14-de-en-preprocess: 160,239 train, 7,283 validation and 6,750 test pairs), to the
three JSON lines files that `prepare_data --source jsonl` reads: OUT/train.jsonl,
OUT/validation.jsonl and OUT/test.jsonl, one {"translation": {"de": "...", "en": "..."}} object a
line, in the dataset's order.

  scripts/iwslt14_to_jsonl.py                       # download (python3 -m pip install datasets)
  scripts/iwslt14_to_jsonl.py --from-dir DIR        # splits already on disk: no network
  build/prepare_data --source jsonl --train OUT/train.jsonl --validation OUT/validation.jsonl \\
      --test OUT/test.jsonl --out .cache/data/iwslt14-gpt2.h5

Downloading fetches the Hub's Parquet export of the dataset (revision refs/convert/parquet) with
huggingface_hub into its cache and reads it with pyarrow; `pip install datasets` brings both. The
dataset's own loading script is never run (datasets 4 refuses loading scripts); the export holds
the same rows.

--from-dir DIR takes each split as JSON lines (.jsonl or .json), a JSON array (.json), Parquet or
Arrow files, anywhere below DIR: what save_to_disk, to_json or to_parquet wrote, a copy of the
Parquet export, or datasets' cache folder of the built dataset. A file belongs to the split its
path below DIR names (train; validation, valid, val or dev; test), e.g. train.jsonl,
train/data-00000-of-00001.arrow, de-en/test/0000.parquet or iwslt14-de-en-preprocess-test.arrow;
a split may be several shards of one format in one folder. A record is {"translation": {"de",
"en"}} as the dataset has it, or {"de", "en"} as `dataset[split]["translation"]` lists them.

Pairs with an empty side are dropped (prepare_data drops them too) and counted. A malformed record,
a missing or empty split or an unreadable file stops the export with one line on stderr: what,
where and the fix. Nothing is written until all three splits were read; each file is written to a
temporary file beside it and renamed, so an output file is either the old one or a whole new one.
Exit status: 0 done, 1 failure, 2 usage.
"""
import argparse
import json
import os
import re
import shlex
import sys
import tempfile

PROG = "iwslt14_to_jsonl.py"
DATASET = "bbaaaa/iwslt14-de-en-preprocess"
PARQUET_REVISION = "refs/convert/parquet"
DEFAULT_OUT = ".cache/data/iwslt14-de-en"
SPLITS = ("train", "validation", "test")
# Words of a file's path (below --from-dir) that name a split.
SPLIT_WORDS = {"train": "train", "validation": "validation", "valid": "validation",
               "val": "validation", "dev": "validation", "test": "test"}
EXTENSIONS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}
# Files that datasets writes beside the data: never records.
METADATA = {"dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json"}
# What prepare_data treats as whitespace (normalize_whitespace in src/data/corpus.cpp).
WHITESPACE = " \t\n\r\v\f\u00a0"
RECORD_FIX = ('each record must be {"translation": {"de": "...", "en": "..."}} or '
              '{"de": "...", "en": "..."}: fix or remove it, or export the split again')
FROM_DIR_FIX = ("pass --from-dir a folder holding the train, validation and test splits as "
                ".jsonl, .json, .parquet or .arrow files whose paths name the split")


class Failure(Exception):
    """An error that ends the export: `what` went wrong where, and `fix` says what to do."""

    def __init__(self, what, fix, status=1):
        super().__init__(what)
        self.what, self.fix, self.status = what, fix, status


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Failure(message, f"see {PROG} --help", status=2)


def parse_args(argv):
    p = Parser(prog=PROG, description=__doc__, allow_abbrev=False,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from-dir", metavar="DIR",
                   help="read the splits from .jsonl, .json, .parquet or .arrow files below "
                        "DIR instead of downloading them (above)")
    p.add_argument("--out-dir", metavar="DIR", default=DEFAULT_OUT,
                   help="folder for train.jsonl, validation.jsonl and test.jsonl "
                        "(default: %(default)s)")
    p.add_argument("--max-pairs", metavar="N", type=int, default=0,
                   help="keep only the first N pairs of each split (pairs; 0 = all)")
    args = p.parse_args(argv)
    if args.max_pairs < 0:
        raise Failure(f"--max-pairs {args.max_pairs} is negative",
                      "pass a count >= 0 (0 = all pairs)", status=2)
    return args


def first_line(error):
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def shown(record):
    """The record as a short one-line JSON text, for messages."""
    try:
        text = json.dumps(record, ensure_ascii=True, default=repr)
    except Exception:  # a record too deep to print
        return "(a record nested too deeply to show)"
    return text if len(text) <= 160 else text[:157] + "..."


def type_name(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "a " + type(value).__name__


def pair_of(record, where):
    """(de, en) of one record, or a Failure naming `where`."""
    fields = record.get("translation") if isinstance(record, dict) and "translation" in record \
        else record
    if not isinstance(fields, dict):
        raise Failure(f"{where}: expected an object with \"de\" and \"en\" texts but got "
                      f"{shown(record)}", RECORD_FIX)
    texts = []
    for lang in ("de", "en"):
        if lang not in fields:
            raise Failure(f"{where}: the record has no \"{lang}\" text: {shown(record)}",
                          RECORD_FIX)
        text = fields[lang]
        if not isinstance(text, str):
            raise Failure(f"{where}: \"{lang}\" is {type_name(text)}, not a string: "
                          f"{shown(record)}", RECORD_FIX)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise Failure(f"{where}: \"{lang}\" holds a lone UTF-16 surrogate (\\ud800-\\udfff), "
                          f"which is not text: {shown(record)}", RECORD_FIX) from None
        texts.append(text)
    return texts


def json_records(path):
    """(where, record) of a JSON lines file or a file holding one JSON array of records."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise Failure(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})",
                      "export the split again as UTF-8 JSON") from None
    except OSError as e:
        raise Failure(f"cannot read {path}: {e.strerror or e}",
                      "check that the file exists and is readable") from None
    if text.lstrip(WHITESPACE).startswith("["):
        try:
            records = json.loads(text)
        except (ValueError, RecursionError) as e:
            line = getattr(e, "lineno", "?")
            raise Failure(f"{path}:{line}: not valid JSON ({getattr(e, 'msg', first_line(e))})",
                          "fix the file, or export the split again") from None
        for i, record in enumerate(records):
            yield f"{path}: item {i}", record
        return
    first = True
    # Lines end at "\n" only, as prepare_data reads them: U+2028 and the like may stand in a text.
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip(WHITESPACE):
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as e:
            if first:  # maybe one pretty-printed object rather than JSON lines
                try:
                    whole = json.loads(text)
                except (ValueError, RecursionError):
                    whole = None
                if isinstance(whole, dict):
                    yield f"{path}", whole
                    return
            raise Failure(f"{path}:{n}: not valid JSON ({getattr(e, 'msg', first_line(e))}, "
                          f"column {getattr(e, 'colno', '?')})",
                          "each line must be one JSON object (JSON lines): fix the line, or "
                          "export the split again") from None
        first = False
        yield f"{path}:{n}", record


def table_records(path, fmt):
    """(where, record) of a Parquet file or an Arrow file (datasets' stream format or a file)."""
    kind = "Parquet" if fmt == "parquet" else "Arrow"
    try:
        import pyarrow as pa
        import pyarrow.ipc
        import pyarrow.parquet as pq
    except ImportError:
        raise Failure(f"{path} is {kind}: reading it needs the Python package pyarrow",
                      "install it (python3 -m pip install pyarrow), or give the splits as JSON "
                      "lines") from None
    try:
        if fmt == "parquet":
            rows = pq.read_table(path).to_pylist()
        else:
            with pa.OSFile(path, "rb") as source:
                try:
                    table = pa.ipc.open_stream(source).read_all()
                except pa.ArrowInvalid:
                    source.seek(0)
                    table = pa.ipc.open_file(source).read_all()
            rows = table.to_pylist()
    except Exception as e:  # pyarrow's errors for unreadable, truncated or foreign files
        raise Failure(f"{path}: cannot read it as {kind}: {first_line(e)}",
                      "download or export the split again") from None
    for i, record in enumerate(rows):
        yield f"{path}: row {i}", record


def find_split_files(root):
    """{split: [(path, format)]} of the data files below `root`, shards in name order."""
    if not os.path.exists(root):
        raise Failure(f"--from-dir {root} does not exist", FROM_DIR_FIX)
    if not os.path.isdir(root):
        raise Failure(f"--from-dir {root} is not a folder", FROM_DIR_FIX)
    def unreadable(error):
        raise Failure(f"cannot read the folder {error.filename}: {error.strerror or error}",
                      "make it readable, or move the splits elsewhere")

    found = {s: [] for s in SPLITS}
    for folder, subfolders, names in os.walk(root, onerror=unreadable):
        subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
        for name in sorted(names):
            ext = os.path.splitext(name)[1].lower()
            if ext not in EXTENSIONS or name.startswith((".", "cache-")) or name in METADATA:
                continue
            path = os.path.join(folder, name)
            words = re.split(r"[\\/._\-\s]+",
                             os.path.splitext(os.path.relpath(path, root))[0].lower())
            splits = sorted({SPLIT_WORDS[w] for w in words if w in SPLIT_WORDS})
            if len(splits) > 1:
                raise Failure(f"{path}: its path names more than one split ({', '.join(splits)})",
                              "rename or move it so that its path below --from-dir names one of "
                              "train, validation, test")
            if splits:
                found[splits[0]].append((path, EXTENSIONS[ext]))
    if not any(found.values()):
        raise Failure(f"{root} holds no .jsonl, .json, .parquet or .arrow file whose path names a "
                      "split", FROM_DIR_FIX)
    for split in SPLITS:
        files = found[split]
        if not files:
            raise Failure(f"{root} holds no file for the {split} split",
                          FROM_DIR_FIX + (" (valid, val and dev count as validation)"
                                          if split == "validation" else ""))
        copies = {}  # (folder, extension) -> its first file
        for path, _ in files:
            copies.setdefault((os.path.dirname(path), os.path.splitext(path)[1].lower()), path)
        if len(copies) > 1:
            a, b = list(copies.values())[:2]
            raise Failure(f"{root} holds more than one copy of the {split} split: {a} and {b}",
                          "point --from-dir at a folder with one copy of each split (one "
                          "version, one format), or remove the other copy")
    return found


def read_split(split, files, max_pairs):
    """The split's (de, en) pairs, the first max_pairs (0 = all), and how many had an empty side."""
    pairs, empty, records = [], 0, 0
    for path, fmt in files:
        source = json_records(path) if fmt == "json" else table_records(path, fmt)
        for where, record in source:
            records += 1
            de, en = pair_of(record, where)
            if not de.strip(WHITESPACE) or not en.strip(WHITESPACE):
                empty += 1
                continue
            pairs.append((de, en))
            if max_pairs and len(pairs) >= max_pairs:
                return pairs, empty
    if not pairs:
        names = ", ".join(p for p, _ in files)
        raise Failure(f"the {split} split has no pairs ({names}: {records} records, {empty} with "
                      "an empty side)", "every split needs at least one pair: download or "
                      "export that split again")
    return pairs, empty


def download():
    """The local folder of the dataset's Parquet export, downloaded into huggingface_hub's cache."""
    missing = []
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        missing.append("huggingface_hub")
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        missing.append("pyarrow")
    if missing:
        raise Failure(f"downloading {DATASET} needs the Python package"
                      f"{'s' if len(missing) > 1 else ''} {' and '.join(missing)}, not installed",
                      "install them with `python3 -m pip install datasets`, or pass --from-dir "
                      "DIR with the splits already on disk")
    print(f"# downloading {DATASET} (its Parquet export, revision {PARQUET_REVISION})", flush=True)
    try:
        path = snapshot_download(repo_id=DATASET, repo_type="dataset",
                                 revision=PARQUET_REVISION, allow_patterns=["*.parquet"])
    except Exception as e:  # network, authentication or cache errors of huggingface_hub
        raise Failure(f"cannot download {DATASET}: {type(e).__name__}: {first_line(e)}",
                      "check the network (HF_ENDPOINT, HF_HUB_OFFLINE), or download the splits "
                      "elsewhere and pass --from-dir DIR") from None
    print(f"# downloaded to {path} (--from-dir {path} converts it again without the network)")
    return path


def write_splits(out_dir, splits):
    """Writes OUT/<split>.jsonl for every split: each to a temporary file, then renamed."""
    targets = {s: os.path.join(out_dir, f"{s}.jsonl") for s in SPLITS}
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise Failure(f"cannot create the output folder {out_dir}: {e.strerror or e}",
                      "pass --out-dir a folder you can write") from None
    for path in targets.values():
        if os.path.isdir(path):
            raise Failure(f"{path} is a folder", "remove it or pass another --out-dir")
    umask = os.umask(0)
    os.umask(umask)
    temps = {}
    current = out_dir
    try:
        for split in SPLITS:
            current = targets[split]
            fd, temps[split] = tempfile.mkstemp(prefix=f".{split}.jsonl.", suffix=".tmp",
                                                dir=out_dir)
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
                for de, en in splits[split]:
                    f.write(json.dumps({"translation": {"de": de, "en": en}},
                                       ensure_ascii=False))
                    f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.chmod(temps[split], 0o666 & ~umask)
        for split in SPLITS:
            current = targets[split]
            os.replace(temps.pop(split), current)
    except OSError as e:
        raise Failure(f"cannot write {current}: {e.strerror or e}",
                      "free space or pick a writable --out-dir, then run again") from None
    finally:
        for temp in temps.values():
            try:
                os.unlink(temp)
            except OSError:
                pass
    return targets


def run(argv):
    args = parse_args(argv)
    root = args.from_dir if args.from_dir is not None else download()
    found = find_split_files(root)
    splits, lines = {}, []
    for split in SPLITS:
        pairs, empty = read_split(split, found[split], args.max_pairs)
        splits[split] = pairs
        files = found[split]
        source = files[0][0] + (f" and {len(files) - 1} more" if len(files) > 1 else "")
        dropped = f", dropped {empty} with an empty side" if empty else ""
        lines.append((split, len(pairs), dropped, source))
    targets = write_splits(args.out_dir, splits)
    for split, n, dropped, source in lines:
        print(f"# {split:<10} {n:8d} pairs from {source}{dropped} -> {targets[split]}")
    print("# next: build/prepare_data --source jsonl " +
          " ".join(f"--{s} {shlex.quote(targets[s])}" for s in SPLITS) +
          " --out .cache/data/iwslt14-gpt2.h5")
    return 0


def main(argv=None):
    try:
        return run(argv)
    except Failure as e:
        print(f"{PROG}: {e.what} -- fix: {e.fix}", file=sys.stderr)
        return e.status
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted -- fix: run it again", file=sys.stderr)
        return 130
    except Exception as e:  # a bug: still one line, with what is needed to report it
        print(f"{PROG}: unexpected {type(e).__name__}: {first_line(e)} -- fix: report it with "
              "the command line", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
