"""scripts/iwslt14_to_jsonl.py: IWSLT14 de-en splits on disk (JSON lines, JSON arrays, Parquet,
Arrow) -> the train/validation/test JSON lines that prepare_data --source jsonl reads. Offline:
every input is made here. A built prepare_data (GPT2P_BIN or build/) and the GPT-2 vocabulary
(GPT2P_VOCAB_DIR or .cache/gpt2-vocab) also check the round trip through the C++ reader."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "iwslt14_to_jsonl.py"
SPLITS = ("train", "validation", "test")

# Texts that JSON, a line reader or a tokenizer could get wrong: quotes and backslashes, a newline
# and a tab inside a text, U+2028 (a line break to str.splitlines, not to prepare_data), NBSP,
# non-ASCII letters and a character outside the BMP.
PAIRS = {
    "train": [
        ("Vielen Dank, Chris.", "Thank you so much, Chris."),
        ('Er sagte: "Größe \\ Maß" – ½ €.', 'He said: "size \\ measure" – ½ €.'),
        ("Zeile eins\nZeile zwei", "line one\nline two"),
        ("Feier 🎉 und\u2028Trenner", "party 🎉 and\u2028separator"),
        ("  Leerzeichen\tund\u00a0NBSP  ", "spaces\tand\u00a0NBSP"),
    ],
    "validation": [("Das ist gut.", "That is good."), ("Ja.", "Yes.")],
    "test": [("Danke.", "Thanks."), ("Bis bald.", "See you soon."), ("Nein.", "No.")],
}

# Runs the script with the named modules unimportable (as if not installed).
BOOT = ("import runpy, sys\n"
        "for m in filter(None, sys.argv[1].split(',')):\n"
        "    sys.modules[m] = None\n"
        "sys.argv = sys.argv[2:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n")


def run(*args, hide=("huggingface_hub", "datasets"), cwd=None):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return subprocess.run([sys.executable, "-c", BOOT, ",".join(hide), str(SCRIPT),
                           *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=60)


def one_line_error(r, status):
    """The single stderr line of a refused run (no traceback), after checking its status."""
    assert r.returncode == status, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("iwslt14_to_jsonl.py: ") and " -- fix: " in lines[0], lines[0]
    assert "Traceback" not in r.stderr
    return lines[0]


def hf_row(de, en):
    return {"translation": {"de": de, "en": en}}


def write_jsonl(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                    encoding="utf-8")
    return path


def write_inputs(folder, pairs=PAIRS):
    """The three splits as the dataset's rows would be dumped: train as HF rows in JSON lines,
    validation as a JSON array of {"de", "en"} (json.dump(dataset[split]["translation"])), test
    as flat JSON lines."""
    write_jsonl(folder / "train.jsonl", [hf_row(de, en) for de, en in pairs["train"]])
    (folder / "validation.json").write_text(
        json.dumps([{"de": de, "en": en} for de, en in pairs["validation"]], ensure_ascii=False,
                   indent=2), encoding="utf-8")
    write_jsonl(folder / "test.jsonl", [{"de": de, "en": en} for de, en in pairs["test"]])
    return folder


def cpp_read_jsonl(path):
    """What gpt2p::data::read_jsonl (src/data/corpus.cpp) accepts, line by line: lines split at
    '\\n' only, blank lines skipped, each line one JSON object {"translation": {"de": string,
    "en": string}} (other members ignored), texts whitespace-normalized, pairs with an empty side
    skipped. Raises AssertionError where the C++ reader would throw."""
    pairs = []
    raw = path.read_bytes()
    assert not raw.startswith(b"\xef\xbb\xbf"), "a BOM would make line 1 invalid JSON"
    for n, line in enumerate(raw.decode("utf-8").split("\n"), 1):
        if not normalize(line):
            continue
        row = json.loads(line)
        ok = (isinstance(row, dict) and isinstance(row.get("translation"), dict)
              and isinstance(row["translation"].get("de"), str)
              and isinstance(row["translation"].get("en"), str))
        assert ok, f"{path}:{n}: {line[:200]}"
        de, en = normalize(row["translation"]["de"]), normalize(row["translation"]["en"])
        if de and en:
            pairs.append((de, en))
    return pairs


def normalize(text):
    """gpt2p::data::normalize_whitespace: runs of ASCII whitespace and NBSP -> one space, trimmed."""
    out, pending = [], False
    for c in text:
        if c in " \t\n\r\v\f\u00a0":
            pending = bool(out)
            continue
        if pending:
            out.append(" ")
        pending = False
        out.append(c)
    return "".join(out)


def read_output(out):
    return {s: [(r["translation"]["de"], r["translation"]["en"])
                for r in map(json.loads, (out / f"{s}.jsonl").read_text(encoding="utf-8")
                             .split("\n")[:-1])] for s in SPLITS}


def test_exports_every_split_in_the_shape_prepare_data_reads(tmp_path):
    out = tmp_path / "out"
    r = run("--from-dir", write_inputs(tmp_path / "in"), "--out-dir", out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr == ""
    assert sorted(p.name for p in out.iterdir()) == ["test.jsonl", "train.jsonl", "validation.jsonl"]
    for split in SPLITS:
        path = out / f"{split}.jsonl"
        text = path.read_text(encoding="utf-8")
        lines = text.split("\n")
        # One object a line, every line ended, nothing else: exactly the dataset's rows, in order.
        assert text.endswith("\n") and lines[-1] == "" and len(lines) - 1 == len(PAIRS[split])
        for line, (de, en) in zip(lines, PAIRS[split]):
            assert json.loads(line) == {"translation": {"de": de, "en": en}}
            assert list(json.loads(line)["translation"]) == ["de", "en"]
        assert cpp_read_jsonl(path) == [(normalize(de), normalize(en)) for de, en in PAIRS[split]]
        assert f"# {split:<10} {len(PAIRS[split]):8d} pairs from " in r.stdout
    assert "# next: build/prepare_data --source jsonl --train " in r.stdout
    assert "ß" in (out / "train.jsonl").read_text(encoding="utf-8")  # UTF-8, not \u escapes


@pytest.mark.parametrize("line", ['{"de": "a", "en": "b"}', '{"translation": {"de": "a"}}',
                                  '{"translation": {"de": 1, "en": "b"}}', "[1]", "{oops"])
def test_the_model_of_the_cpp_reader_refuses_what_it_refuses(tmp_path, line):
    """cpp_read_jsonl, the check of the export above, is not vacuous."""
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(hf_row("a", "b")) + "\n" + line + "\n")
    with pytest.raises((AssertionError, ValueError)):
        cpp_read_jsonl(path)


def prepare_data_and_vocab():
    binary = Path(os.environ.get("GPT2P_BIN") or ROOT / "build") / "prepare_data"
    vocab = Path(os.environ.get("GPT2P_VOCAB_DIR") or ROOT / ".cache" / "gpt2-vocab")
    have_vocab = (vocab / "encoder.json").is_file() or (vocab / "vocab.json").is_file()
    if binary.is_file() and os.access(binary, os.X_OK) and have_vocab:
        return binary, vocab
    return None


@pytest.mark.skipif(prepare_data_and_vocab() is None,
                    reason="prepare_data is not built (GPT2P_BIN or build/) or the GPT-2 "
                           "vocabulary is missing (GPT2P_VOCAB_DIR or .cache/gpt2-vocab)")
def test_prepare_data_reads_the_export_back(tmp_path):
    h5py = pytest.importorskip("h5py")
    binary, vocab = prepare_data_and_vocab()
    out = tmp_path / "out"
    assert run("--from-dir", write_inputs(tmp_path / "in"), "--out-dir", out).returncode == 0
    data = tmp_path / "iwslt.h5"
    r = subprocess.run([str(binary), "--source", "jsonl", "--train", str(out / "train.jsonl"),
                        "--validation", str(out / "validation.jsonl"),
                        "--test", str(out / "test.jsonl"), "--vocab-dir", str(vocab),
                        "--out", str(data)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    with h5py.File(data, "r") as f:
        for split in SPLITS:
            assert int(f.attrs[f"n_{split}"]) == len(PAIRS[split])
            got = [(de.decode() if isinstance(de, bytes) else de,
                    en.decode() if isinstance(en, bytes) else en)
                   for de, en in zip(f[split]["text_de"][()], f[split]["text_en"][()])]
            assert got == [(normalize(de), normalize(en)) for de, en in PAIRS[split]]


def test_max_pairs_keeps_the_first_pairs_of_each_split(tmp_path):
    out = tmp_path / "out"
    r = run("--from-dir", write_inputs(tmp_path / "in"), "--out-dir", out, "--max-pairs", 2)
    assert r.returncode == 0, r.stderr
    assert read_output(out) == {s: PAIRS[s][:2] for s in SPLITS}


@pytest.mark.parametrize("args, message", [
    (["--max-pairs", "-1"], "--max-pairs -1 is negative"),
    (["--max-pairs", "two"], "argument --max-pairs: invalid int value: 'two'"),
    (["--from-dir"], "argument --from-dir: expected one argument"),
    (["--from", "x"], "unrecognized arguments: --from x"),
    (["stray"], "unrecognized arguments: stray"),
])
def test_usage_errors_exit_2_with_one_line(tmp_path, args, message):
    line = one_line_error(run(*args, "--out-dir", tmp_path / "out"), 2)
    assert message in line
    assert not (tmp_path / "out").exists()


def test_missing_from_dir_is_named(tmp_path):
    line = one_line_error(run("--from-dir", tmp_path / "nope", "--out-dir", tmp_path / "out"), 1)
    assert f"--from-dir {tmp_path / 'nope'} does not exist" in line
    assert not (tmp_path / "out").exists()


def test_a_missing_split_is_named(tmp_path):
    inputs = write_inputs(tmp_path / "in")
    (inputs / "validation.json").unlink()
    line = one_line_error(run("--from-dir", inputs, "--out-dir", tmp_path / "out"), 1)
    assert f"{inputs} holds no file for the validation split" in line
    assert "valid, val and dev count as validation" in line


def test_a_folder_without_data_files_is_refused(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "notes.txt").write_text("train")
    line = one_line_error(run("--from-dir", tmp_path / "in", "--out-dir", tmp_path / "out"), 1)
    assert "holds no .jsonl, .json, .parquet or .arrow file whose path names a split" in line


def test_without_local_input_or_the_hub_packages_it_says_what_to_install(tmp_path):
    line = one_line_error(run("--out-dir", tmp_path / "out",
                              hide=("huggingface_hub", "datasets", "pyarrow")), 1)
    assert "needs the Python packages huggingface_hub and pyarrow" in line
    assert "python3 -m pip install datasets" in line and "--from-dir" in line


@pytest.mark.parametrize("line, message", [
    ('{"translation": {"de": "Hallo"}}', 'the record has no "en" text'),
    ('{"translation": {"en": "Hello"}}', 'the record has no "de" text'),
    ('{"de": "Hallo", "english": "Hello"}', 'the record has no "en" text'),
    ('{"translation": {"de": "Hallo", "en": null}}', '"en" is null, not a string'),
    ('{"translation": {"de": ["Hallo"], "en": "Hello"}}', '"de" is an array, not a string'),
    ('{"translation": "Hallo ||| Hello"}', 'expected an object with "de" and "en" texts'),
    ('"Hallo"', 'expected an object with "de" and "en" texts'),
    ('{"translation": {"de": "Hallo", "en": "Hello"}', "not valid JSON"),
    ('{"translation": {"de": "\\ud800", "en": "Hello"}}', "lone UTF-16 surrogate"),
])
def test_a_malformed_record_is_named_by_file_and_line(tmp_path, line, message):
    inputs = write_inputs(tmp_path / "in")
    test = inputs / "test.jsonl"
    test.write_text(test.read_text(encoding="utf-8") + "\n" + line + "\n", encoding="utf-8")
    bad_line = len(PAIRS["test"]) + 2  # after the good lines and one blank line
    err = one_line_error(run("--from-dir", inputs, "--out-dir", tmp_path / "out"), 1)
    assert f"{test}:{bad_line}: " in err and message in err, err
    assert '{"translation": {"de": "...", "en": "..."}}' in err or "JSON lines" in err
    assert not (tmp_path / "out").exists()  # nothing is written before every split was read


def test_a_malformed_item_of_a_json_array_is_named(tmp_path):
    inputs = write_inputs(tmp_path / "in")
    (inputs / "validation.json").write_text('[{"de": "a", "en": "b"}, {"de": "c"}]')
    err = one_line_error(run("--from-dir", inputs, "--out-dir", tmp_path / "out"), 1)
    assert f"{inputs / 'validation.json'}: item 1: the record has no \"en\" text" in err


@pytest.mark.parametrize("content", ["", "\n\n", '{"translation": {"de": " ", "en": "x"}}\n'])
def test_an_empty_split_is_refused(tmp_path, content):
    inputs = write_inputs(tmp_path / "in")
    (inputs / "test.jsonl").write_text(content)
    err = one_line_error(run("--from-dir", inputs, "--out-dir", tmp_path / "out"), 1)
    assert "the test split has no pairs" in err
    assert not (tmp_path / "out").exists()


def test_pairs_with_an_empty_side_are_dropped_and_counted(tmp_path):
    pairs = dict(PAIRS, train=PAIRS["train"][:2])
    inputs = write_inputs(tmp_path / "in", pairs)
    write_jsonl(inputs / "train.jsonl", [hf_row(*pairs["train"][0]), hf_row("\u00a0 \t", "x"),
                                         hf_row("y", ""), hf_row(*pairs["train"][1])])
    r = run("--from-dir", inputs, "--out-dir", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert read_output(tmp_path / "out")["train"] == pairs["train"]
    assert "dropped 2 with an empty side" in r.stdout


def test_split_names_shards_and_layouts_of_saved_datasets(tmp_path):
    """valid/dev name the validation split; shards of one folder are read in name order;
    datasets' metadata files are not data."""
    inputs = tmp_path / "in"
    write_jsonl(inputs / "data" / "train-00000-of-00002.jsonl", [hf_row(*PAIRS["train"][0])])
    write_jsonl(inputs / "data" / "train-00001-of-00002.jsonl", [hf_row(*PAIRS["train"][1])])
    write_jsonl(inputs / "dev" / "part.jsonl", [hf_row(*p) for p in PAIRS["validation"]])
    write_jsonl(inputs / "iwslt14-de-en-preprocess-test.jsonl", [hf_row(*p) for p in PAIRS["test"]])
    (inputs / "dev" / "state.json").write_text('{"_split": "validation"}')
    (inputs / "dataset_dict.json").write_text('{"splits": ["train", "validation", "test"]}')
    r = run("--from-dir", inputs, "--out-dir", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert read_output(tmp_path / "out") == dict(PAIRS, train=PAIRS["train"][:2])
    assert "train-00000-of-00002.jsonl and 1 more" in r.stdout


def test_two_copies_of_a_split_are_refused(tmp_path):
    inputs = write_inputs(tmp_path / "in")
    write_jsonl(inputs / "train.json", [hf_row("a", "b")])
    err = one_line_error(run("--from-dir", inputs, "--out-dir", tmp_path / "out"), 1)
    assert "holds more than one copy of the train split" in err


def test_a_pretty_printed_single_record_is_read(tmp_path):
    inputs = write_inputs(tmp_path / "in")
    (inputs / "test.jsonl").unlink()
    (inputs / "test.json").write_text(json.dumps(hf_row("Ja", "Yes"), indent=2))
    r = run("--from-dir", inputs, "--out-dir", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert read_output(tmp_path / "out")["test"] == [("Ja", "Yes")]


def test_output_dir_problems_are_one_line(tmp_path):
    inputs = write_inputs(tmp_path / "in")
    (tmp_path / "file").write_text("x")
    err = one_line_error(run("--from-dir", inputs, "--out-dir", tmp_path / "file"), 1)
    assert f"cannot create the output folder {tmp_path / 'file'}" in err
    (tmp_path / "out" / "test.jsonl").mkdir(parents=True)
    err = one_line_error(run("--from-dir", inputs, "--out-dir", tmp_path / "out"), 1)
    assert f"{tmp_path / 'out' / 'test.jsonl'} is a folder" in err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["test.jsonl"]


def load_script():
    spec = importlib.util.spec_from_file_location("iwslt14_to_jsonl", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_failed_write_leaves_the_old_files_and_no_temporaries(tmp_path, monkeypatch, capsys):
    """Disk full while writing the last split: every old output is kept whole, no temporary
    file is left, and the error is one line."""
    inputs = write_inputs(tmp_path / "in")
    out = tmp_path / "out"
    script = load_script()
    assert script.main(["--from-dir", str(inputs), "--out-dir", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    write_inputs(inputs, {s: [("neu " + de, "new " + en) for de, en in PAIRS[s]] for s in SPLITS})
    capsys.readouterr()

    real_fsync, calls = os.fsync, []

    def fsync(fd):
        calls.append(fd)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(script.os, "fsync", fsync)
    assert script.main(["--from-dir", str(inputs), "--out-dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [f"iwslt14_to_jsonl.py: cannot write {out / 'test.jsonl'}: No space "
                                "left on device -- fix: free space or pick a writable --out-dir, "
                                "then run again"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before

    monkeypatch.setattr(script.os, "fsync", real_fsync)
    assert script.main(["--from-dir", str(inputs), "--out-dir", str(out)]) == 0
    assert read_output(out)["train"][0] == ("neu " + PAIRS["train"][0][0],
                                            "new " + PAIRS["train"][0][1])
    assert sorted(p.name for p in out.iterdir()) == ["test.jsonl", "train.jsonl", "validation.jsonl"]
    mode = (out / "train.jsonl").stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask  # not mkstemp's 0600


def test_a_bad_input_keeps_earlier_outputs(tmp_path):
    inputs = write_inputs(tmp_path / "in")
    out = tmp_path / "out"
    assert run("--from-dir", inputs, "--out-dir", out).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (inputs / "test.jsonl").write_text('{"translation": {"de": "x"}}\n')
    one_line_error(run("--from-dir", inputs, "--out-dir", out), 1)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_parquet_export_and_arrow_cache_layouts(tmp_path):
    """The Hub's Parquet export (de-en/<split>/0000.parquet) and datasets' Arrow files (stream
    format, as its cache and save_to_disk hold them), with the translation struct column."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.ipc  # noqa: F401
    import pyarrow.parquet as pq

    def table(pairs):
        return pa.table({"translation": pa.array([{"de": de, "en": en} for de, en in pairs],
                                                 pa.struct([("de", pa.string()),
                                                            ("en", pa.string())]))})

    export = tmp_path / "export"
    for split in SPLITS:
        (export / "de-en" / split).mkdir(parents=True)
        pq.write_table(table(PAIRS[split]), str(export / "de-en" / split / "0000.parquet"))
    r = run("--from-dir", export, "--out-dir", tmp_path / "out1")
    assert r.returncode == 0, r.stderr
    assert read_output(tmp_path / "out1") == PAIRS

    cache = tmp_path / "cache" / "de-en" / "0.0.0" / "abc123"
    cache.mkdir(parents=True)
    for split in SPLITS:
        t = table(PAIRS[split])
        with pa.OSFile(str(cache / f"iwslt14-de-en-preprocess-{split}.arrow"), "wb") as sink:
            with pa.ipc.new_stream(sink, t.schema) as writer:
                writer.write_table(t)
    (cache / "dataset_info.json").write_text("{}")
    r = run("--from-dir", tmp_path / "cache", "--out-dir", tmp_path / "out2")
    assert r.returncode == 0, r.stderr
    assert read_output(tmp_path / "out2") == PAIRS

    (export / "de-en" / "test" / "0000.parquet").write_bytes(b"PAR1 not really")
    err = one_line_error(run("--from-dir", export, "--out-dir", tmp_path / "out3"), 1)
    assert "0000.parquet: cannot read it as Parquet" in err


def test_parquet_without_pyarrow_says_what_to_install(tmp_path):
    inputs = tmp_path / "in"
    for split in SPLITS:
        (inputs / split).mkdir(parents=True)
        (inputs / split / "0000.parquet").write_bytes(b"PAR1")
    err = one_line_error(run("--from-dir", inputs, "--out-dir", tmp_path / "out",
                             hide=("pyarrow",)), 1)
    assert "is Parquet: reading it needs the Python package pyarrow" in err
    assert "python3 -m pip install pyarrow" in err
