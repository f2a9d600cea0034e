"""A tokenizer is identified by what its ids mean (``dew.data.tokenizer_identity``): two BPEs of one
vocabulary size trained on different text are two tokenizers, the same one copied by dew-prepare or
saved in another layout is one; token files whose sidecars (or whose ``data.tokenizer``) name two
tokenizers are refused, and files that name none are read as before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dew.data.prepare import prepare
from dew.data.specs import TokenWindows
from dew.data.token_files import read_sidecar
from dew.data.tokenizer_identity import byte_identity, file_identity, identity

VOCAB = 300


def corpus(path: Path, letters: str, seed: int) -> Path:
    """Words of ``letters`` alone: a BPE of ``VOCAB`` ids trained on it merges other pairs than one
    trained on other letters, with as many ids."""
    rng = np.random.default_rng(seed)
    words = ["".join(rng.choice(list(letters), rng.integers(2, 6))) for _ in range(60)]
    path.write_text(" ".join(rng.choice(words, 2000)) + "\n")
    return path


@pytest.fixture
def prepared(tmp_path: Path) -> dict[str, Path]:
    """Token directories: ``a`` and ``b`` of two BPEs of ``VOCAB`` ids, ``a2`` other text encoded by
    ``a``'s tokenizer (``dew-prepare --tokenizer a``), ``bytes`` of the byte tokenizer."""
    a_text, b_text = corpus(tmp_path / "a.txt", "abcdefgh", 0), corpus(tmp_path / "b.txt", "mnopqrst", 1)
    prepare([str(a_text)], str(tmp_path / "a"), tokenizer="bpe", vocab_size=VOCAB)
    prepare([str(b_text)], str(tmp_path / "b"), tokenizer="bpe", vocab_size=VOCAB)
    prepare([str(b_text)], str(tmp_path / "a2"), tokenizer=str(tmp_path / "a"))
    prepare([str(a_text)], str(tmp_path / "bytes"))
    return {name: tmp_path / name for name in ("a", "b", "a2", "bytes")}


def sidecar_identity(directory: Path):
    return identity(read_sidecar([str(directory / "train.bin")])["tokenizer"])


def test_the_identity_is_what_the_ids_mean(prepared, tmp_path):
    a, b, a2 = (sidecar_identity(prepared[k]) for k in ("a", "b", "a2"))
    assert (a.vocab, b.vocab) == (VOCAB, VOCAB) and a != b and a.digest != b.digest
    assert a2 == a and str(a) == f"bpe (vocab {VOCAB}, digest {a.digest[:12]})"
    # Another layout of the same file (merges as "x y" strings, as older tokenizers wrote them; a
    # truncation setting; another place) is the same tokenizer; one merge more is another.
    content = json.loads((prepared["a"] / "tokenizer.json").read_text())
    assert content["model"]["merges"] and isinstance(content["model"]["merges"][0], list)
    content["model"]["merges"] = [" ".join(m) for m in content["model"]["merges"]]
    content["truncation"] = {"max_length": 8, "strategy": "LongestFirst", "stride": 0, "direction": "Right"}
    (tmp_path / "old.json").write_text(json.dumps(content, indent=1))
    assert file_identity(str(tmp_path / "old.json")) == a
    content["model"]["merges"] = content["model"]["merges"][:-1]
    (tmp_path / "fewer.json").write_text(json.dumps(content))
    assert file_identity(str(tmp_path / "fewer.json")) != a
    # The byte tokenizer is its Hugging Face form, which dew-export writes for a byte run.
    from dew.training.checkpointing.hf_tokenizer import byte_tokenizer

    (tmp_path / "bytes.json").write_text(byte_tokenizer())
    assert sidecar_identity(prepared["bytes"]) == byte_identity() == file_identity(str(tmp_path / "bytes.json"))
    assert str(byte_identity()) == "bytes (vocab 257)"


def test_sidecars_of_two_tokenizers_are_refused(prepared):
    a, b, a2 = (str(prepared[k] / "train.bin") for k in ("a", "b", "a2"))
    with pytest.raises(ValueError) as caught:
        TokenWindows(path=a, val_path=b, seq_len=8).load(2, 0)
    message = str(caught.value)
    assert message.startswith("the token files' sidecars name different tokenizers (the same ids mean other text): ")
    assert str(sidecar_identity(prepared["a"])) in message and str(sidecar_identity(prepared["b"])) in message
    # The same tokenizer in two directories; a sidecar of an older dew that names no tokenizer.
    assert TokenWindows(path=a, val_path=a2, seq_len=8).load(2, 0).tokenizer["kind"] == "bpe"
    old = json.loads((prepared["b"] / "tokens.json").read_text())
    del old["tokenizer"]
    (prepared["b"] / "tokens.json").write_text(json.dumps(old))
    assert read_sidecar([a, b])["vocab_size"] == VOCAB


def test_a_data_tokenizer_that_is_not_the_files_is_refused(prepared, tmp_path):
    a, b = prepared["a"], prepared["b"]
    with pytest.raises(ValueError) as caught:
        TokenWindows(path=str(b / "train.bin"), seq_len=8, tokenizer=str(a)).load(2, 0)
    assert str(caught.value) == (
        f"data.tokenizer='{a}' is {sidecar_identity(a)}, but {b / 'tokens.json'} says its token files were made by "
        f"{sidecar_identity(b)}: set data.tokenizer='{a}' to the files' tokenizer, or drop it to read theirs"
    )
    # The files' own tokenizer named again, or files with no sidecar: read as data.tokenizer says.
    assert TokenWindows(path=str(b / "train.bin"), seq_len=8, tokenizer=str(b)).load(2, 0).tokenizer["kind"] == "bpe"
    (tmp_path / "raw").mkdir()
    shutil.copy(b / "train.bin", tmp_path / "raw" / "train.bin")
    raw = TokenWindows(path=str(tmp_path / "raw" / "train.bin"), seq_len=8, tokenizer=str(a)).load(2, 0)
    assert identity(raw.tokenizer) == sidecar_identity(a)
