"""Tokenizers that turn text into token ids and back: UTF-8 bytes, or a BPE trained by the
``tokenizers`` library. The ``tokens.json`` sidecar (``dew.data.token_files``) names one, so
``token_windows``, ``text_stream`` and samplers decode with what the data was encoded with.

Sidecar ``tokenizer`` records:

- ``{"kind": "byte", "eos_id": 256}``: ids 0..255 are the UTF-8 bytes, 256 ends a document;
- ``{"kind": "bpe", "file": "tokenizer.json", "eos_id": E}``: a ``tokenizers`` BPE (byte-level
  pre-tokenizer, so any text encodes) saved beside the sidecar; ``E`` is its ``<|endoftext|>`` id.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import tokenizers

EOS = "<|endoftext|>"
BYTE_VOCAB = 257


@dataclasses.dataclass(frozen=True)
class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, plus the end-of-text id 256."""

    eos_id: int = 256
    vocab_size: int = BYTE_VOCAB

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)

    def decode(self, ids: Sequence[int]) -> str:
        data = bytes(int(i) for i in ids if 0 <= int(i) < 256)
        return data.decode("utf-8", errors="replace")

    def record(self) -> dict:
        return {"kind": "byte", "eos_id": self.eos_id}


@dataclasses.dataclass(frozen=True)
class BPETokenizer:
    """A byte-level BPE of the ``tokenizers`` library, saved as ``file``."""

    file: str
    tokenizer: tokenizers.Tokenizer = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_file(cls, file: str) -> BPETokenizer:
        import tokenizers

        if not os.path.isfile(file):
            raise FileNotFoundError(f"tokenizer file {file} does not exist")
        return cls(file, tokenizers.Tokenizer.from_file(file))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    @property
    def eos_id(self) -> int:
        eos = self.tokenizer.token_to_id(EOS)
        if eos is None:
            raise ValueError(f"tokenizer file {self.file} has no {EOS} token (dew-prepare trains it in)")
        return eos

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text).ids, np.int32)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def record(self) -> dict:
        return {"kind": "bpe", "file": os.path.basename(self.file), "eos_id": self.eos_id}


Tokenizer = ByteTokenizer | BPETokenizer


def train_bpe(files: Sequence[str], vocab_size: int, out_file: str) -> BPETokenizer:
    """Train a byte-level BPE of ``vocab_size`` ids on ``files`` and save it as ``out_file``."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if vocab_size < 256 + 1:
        raise ValueError(
            f"--vocab-size={vocab_size} must be >= 257 (the 256 byte symbols and {EOS}) for a byte-level BPE"
        )
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(list(files), trainer)
    tok.save(out_file)
    return BPETokenizer(out_file, tok)


def from_record(record: Mapping[str, object]) -> Tokenizer:
    """The tokenizer a sidecar's ``tokenizer`` record names (its ``file`` already resolved)."""
    kind = record.get("kind")
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        return BPETokenizer.from_file(str(record["file"]))
    raise ValueError(f"tokenizer record {dict(record)}: kind={kind!r} must be 'byte' or 'bpe'")


def from_sidecar(path: str) -> Tokenizer:
    """The tokenizer of the ``tokens.json`` sidecar at ``path``."""
    with open(path) as f:
        record = json.load(f)
    tokenizer = dict(record.get("tokenizer") or {})
    if "file" in tokenizer:
        tokenizer["file"] = os.path.join(os.path.dirname(os.path.abspath(path)), tokenizer["file"])
    return from_record(tokenizer)
