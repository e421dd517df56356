"""scripts/device/check_tokenizer.py and check_hf.py, the reference checks of the GPU machine:
their syntax everywhere; where our tokenize is built and a reference package is missing, the
tokenizer check ends with exit 2 and says which (it runs fully only beside transformers and
tiktoken, on the GPU machine: scripts/gpu-check refs)."""

import importlib.util
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEVICE = ROOT / "scripts" / "device"
TOKENIZE = Path(os.environ.get("GPT2P_BIN") or ROOT / "build") / "tokenize"


@pytest.mark.parametrize("name", ["check_tokenizer.py", "check_hf.py"])
def test_the_checks_compile_and_document_their_usage(name, tmp_path):
    py_compile.compile(str(DEVICE / name), cfile=str(tmp_path / "x.pyc"), doraise=True)
    assert "usage" in (DEVICE / name).read_text().lower() or "python3 scripts/device/" in (DEVICE / name).read_text()


def test_tokenizer_check_refuses_a_missing_program(tmp_path):
    r = subprocess.run([sys.executable, str(DEVICE / "check_tokenizer.py"), str(tmp_path / "tokenize")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "is not an executable" in r.stderr or "missing" in r.stderr


@pytest.mark.skipif(not os.access(TOKENIZE, os.X_OK) or not (ROOT / ".cache" / "gpt2-vocab" / "encoder.json").exists()
                    or (importlib.util.find_spec("transformers") and importlib.util.find_spec("tiktoken")),
                    reason="needs our tokenize built and a reference package missing")
def test_tokenizer_check_names_the_missing_reference():
    r = subprocess.run([sys.executable, str(DEVICE / "check_tokenizer.py"), str(TOKENIZE)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "cannot import" in r.stdout + r.stderr
