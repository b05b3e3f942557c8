"""Fixtures: a generated tiny checkpoint's tokenizer (natural size) and a padded one (0.3B vocab)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fd_core.testing.checkpoints import generate_checkpoint
from fd_core.tokenizer import Tokenizer
from fd_core.tokenizer.spm_builder import pad_model, write_tokenizer_files

PADDED_VOCAB = 103424  # ERNIE-4.5-0.3B's vocab_size


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_checkpoint(tmp_path_factory.mktemp("tiny-dense"), "tiny-dense", dtype="float32")


@pytest.fixture(scope="session")
def padded_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("padded-tokenizer")
    model = pad_model((tiny_dir / "tokenizer.model").read_bytes(), PADDED_VOCAB)
    write_tokenizer_files(out, model, model_max_length=131072)
    (out / "config.json").write_text(json.dumps({"model_type": "ernie4_5"}))
    return out


@pytest.fixture(scope="session")
def tok(tiny_dir: Path) -> Tokenizer:
    return Tokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="session")
def padded_tok(padded_dir: Path) -> Tokenizer:
    return Tokenizer.from_pretrained(padded_dir)


@pytest.fixture(scope="session")
def hf_tok(tiny_dir: Path):  # noqa: ANN201 - transformers is a test-only dependency
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(tiny_dir)
