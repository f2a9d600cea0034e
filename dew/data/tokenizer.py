"""Tokenizers that turn text into token ids and back: UTF-8 bytes, a BPE trained by the
``tokenizers`` library, or a pretrained one (a Hugging Face ``tokenizer.json``, alone or in a model
directory). The ``tokens.json`` sidecar (``dew.data.token_files``) names one, so ``token_windows``,
``text_stream``, ``hf_text`` and samplers decode with what the data was encoded with.

Sidecar ``tokenizer`` records:

- ``{"kind": "byte", "eos_id": 256}``: ids 0..255 are the UTF-8 bytes, 256 ends a document;
- ``{"kind": "bpe", "file": "tokenizer.json", "eos_id": E}``: a ``tokenizers`` BPE (byte-level
  pre-tokenizer, so any text encodes) saved beside the sidecar; ``E`` is its ``<|endoftext|>`` id;
- ``{"kind": "pretrained", "file": "tokenizer.json", "eos_id": E, "bos_id": B}``: a tokenizer made
  elsewhere (a model's), its end-of-text and begin-of-text ids read from the ``tokenizer_config.json``
  beside it (``eos_token``, ``bos_token``), else from the special tokens it holds. A document is
  encoded without the tokenizer's own special tokens, then framed as ``[B] + ids + [E]`` (no ``B``
  when there is none, or when it is ``E``, as in GPT-2's).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from dew.data.token_files import SIDECAR
from dew.data.tokenizer_identity import EOS

if TYPE_CHECKING:
    import tokenizers


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


TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
EOS_NAMES = (EOS, "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>")
"""End-of-text tokens looked for, in order, when no ``tokenizer_config.json`` names one."""
BOS_NAMES = ("<s>", "<|begin_of_text|>", "<bos>")


def _token_name(value: object) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string, or ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


@dataclasses.dataclass(frozen=True)
class PretrainedTokenizer:
    """A tokenizer of the ``tokenizers`` library made elsewhere (a Hugging Face model's ``tokenizer.json``)."""

    file: str
    eos_id: int
    bos_id: int | None
    tokenizer: tokenizers.Tokenizer = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_path(cls, path: str) -> PretrainedTokenizer:
        """The tokenizer of ``path``: a ``tokenizer.json`` or a directory holding one (a model's), its
        special tokens from the ``tokenizer_config.json`` beside it, else from the tokens it holds."""
        import tokenizers  # heavy: the Rust library loads only when a tokenizer is used

        file = os.path.join(path, TOKENIZER_FILE) if os.path.isdir(path) else path
        if not os.path.isfile(file):
            where = f"{path} holds no {TOKENIZER_FILE}" if os.path.isdir(path) else f"{path} does not exist"
            raise FileNotFoundError(f"tokenizer {where}: give a {TOKENIZER_FILE} or a model directory holding one")
        try:
            tok = tokenizers.Tokenizer.from_file(file)
        except Exception as e:  # the library raises a bare Exception on a file it cannot parse
            raise ValueError(f"{file}: not a tokenizers file ({e})") from None
        config: dict = {}
        config_file = os.path.join(os.path.dirname(file), TOKENIZER_CONFIG)
        if os.path.isfile(config_file):
            with open(config_file) as f:
                try:
                    config = json.load(f)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{config_file}: not valid JSON ({e})") from None
        eos = cls._special(tok, config, "eos_token", EOS_NAMES, file)
        if eos is None:
            raise ValueError(
                f"{file}: no end-of-text token: {TOKENIZER_CONFIG} names no eos_token and the tokenizer holds none of "
                f"{', '.join(EOS_NAMES)}"
            )
        bos = None if config.get("add_bos_token") is False else cls._special(tok, config, "bos_token", BOS_NAMES, file)
        return cls(file, eos, None if bos == eos else bos, tok)

    @staticmethod
    def _special(
        tok: tokenizers.Tokenizer, config: Mapping[str, object], key: str, names: Sequence[str], file: str
    ) -> int | None:
        named = _token_name(config.get(key))
        if named is not None:
            found = tok.token_to_id(named)
            if found is None:
                raise ValueError(f"{TOKENIZER_CONFIG} beside {file}: {key}={named!r} is not a token of the tokenizer")
            return int(found)
        for name in names:
            found = tok.token_to_id(name)
            if found is not None:
                return int(found)
        return None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """``encode`` of each text, in the library's threads."""
        return [np.asarray(e.ids, np.int32) for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def record(self) -> dict:
        return {"kind": "pretrained", "file": os.path.basename(self.file), "eos_id": self.eos_id, "bos_id": self.bos_id}


Tokenizer = ByteTokenizer | BPETokenizer | PretrainedTokenizer


def document(tokenizer: Tokenizer, ids: np.ndarray) -> np.ndarray:
    """One document's ids framed for packing: the begin-of-text id (a pretrained tokenizer's, when
    it has one), the ids, then the end-of-text id."""
    bos = getattr(tokenizer, "bos_id", None)
    head = [np.int32(bos)] if bos is not None else []
    return np.concatenate([np.array(head, np.int32), ids.astype(np.int32), np.array([tokenizer.eos_id], np.int32)])


def encode_documents(tokenizer: Tokenizer, texts: Sequence[str]) -> list[np.ndarray]:
    """Each text encoded and framed as one document (``document``)."""
    if isinstance(tokenizer, PretrainedTokenizer):
        return [document(tokenizer, ids) for ids in tokenizer.encode_batch(texts)]
    return [document(tokenizer, tokenizer.encode(text)) for text in texts]


def absolute_record(tokenizer: Tokenizer) -> dict:
    """``tokenizer.record()`` with its ``file`` an absolute path: what a loaded dataset hands its
    objective and sampler, wherever the run is started from."""
    record = tokenizer.record()
    if not isinstance(tokenizer, ByteTokenizer):
        record["file"] = os.path.abspath(tokenizer.file)
    return record


def copy_files(tokenizer: Tokenizer, directory: str) -> None:
    """Put the files ``tokenizer.record()`` names (relative to a sidecar) into ``directory``: a BPE's
    or a pretrained tokenizer's ``tokenizer.json``, and the ``tokenizer_config.json`` beside it."""
    if isinstance(tokenizer, ByteTokenizer):
        return
    sources = [tokenizer.file]
    config = os.path.join(os.path.dirname(tokenizer.file), TOKENIZER_CONFIG)
    if isinstance(tokenizer, PretrainedTokenizer) and os.path.isfile(config):
        sources.append(config)
    for source in sources:
        target = os.path.join(directory, os.path.basename(source))
        if os.path.abspath(source) != os.path.abspath(target):
            shutil.copyfile(source, target)


def save_record(record: Mapping[str, object], directory: str) -> None:
    """Keep a loaded dataset's tokenizer ``record`` (``file`` absolute) in ``directory``: its files
    copied there and the record, naming them, as the ``tokens.json`` sidecar (written last)."""
    os.makedirs(directory, exist_ok=True)
    kept = dict(record)
    if "file" in record:
        source = str(record["file"])
        config = os.path.join(os.path.dirname(source), TOKENIZER_CONFIG)
        for path in [source] + ([config] if record.get("kind") == "pretrained" and os.path.isfile(config) else []):
            shutil.copyfile(path, os.path.join(directory, os.path.basename(path)))
        kept["file"] = os.path.basename(source)
    tmp = os.path.join(directory, f"{SIDECAR}.tmp")
    with open(tmp, "w") as f:
        json.dump({"tokenizer": kept}, f, indent=2)
    os.replace(tmp, os.path.join(directory, SIDECAR))


def saved_record(directory: str) -> dict | None:
    """The record ``save_record`` kept in ``directory`` (``file`` absolute), None when there is none."""
    sidecar = os.path.join(directory, SIDECAR)
    if not os.path.isfile(sidecar):
        return None
    with open(sidecar) as f:
        record = dict(json.load(f)["tokenizer"])
    if "file" in record:
        record["file"] = os.path.join(os.path.abspath(directory), str(record["file"]))
    return record


def load_tokenizer(path: str | None, field: str) -> Tokenizer:
    """The tokenizer ``path`` names: None the UTF-8 bytes; a ``tokens.json`` sidecar (or a directory
    holding one) the tokenizer dew-prepare recorded there; a ``tokenizer.json``, or a model directory
    holding one, a pretrained tokenizer. Errors name ``field``."""
    if path is None:
        return ByteTokenizer()
    path = os.path.expanduser(path)
    sidecar = os.path.join(path, SIDECAR) if os.path.isdir(path) else path
    try:
        if os.path.basename(sidecar) == SIDECAR and os.path.isfile(sidecar):
            return from_sidecar(sidecar)
        return PretrainedTokenizer.from_path(path)
    except (OSError, ValueError) as e:
        raise type(e)(f"{field}={path!r}: {e}") from None


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
    if kind == "pretrained":
        tok = PretrainedTokenizer.from_path(str(record["file"]))
        bos = record.get("bos_id")
        eos = record.get("eos_id")
        return dataclasses.replace(
            tok,
            eos_id=tok.eos_id if not isinstance(eos, int) else eos,
            bos_id=bos if isinstance(bos, int) else None,
        )
    raise ValueError(f"tokenizer record {dict(record)}: kind={kind!r} must be 'byte', 'bpe' or 'pretrained'")


def from_sidecar(path: str) -> Tokenizer:
    """The tokenizer of the ``tokens.json`` sidecar at ``path``."""
    with open(path) as f:
        record = json.load(f)
    tokenizer = dict(record.get("tokenizer") or {})
    if "file" in tokenizer:
        tokenizer["file"] = os.path.join(os.path.dirname(os.path.abspath(path)), tokenizer["file"])
    return from_record(tokenizer)
