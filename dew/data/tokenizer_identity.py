"""What identifies a tokenizer: the meaning it gives each id, as a digest of its canonical content.

Token data is only meaningful to a model trained on data of the same tokenizer. The vocabulary size
is no test of that (two BPEs trained on different corpora share it; a run's vocabulary may be padded
past its data's ids), so the tokenizer a record names (``dew.data.tokenizer``'s sidecar records:
``byte``, ``bpe``, ``pretrained``) is identified by a SHA-256 of what makes an id mean a string:

- a ``tokenizers`` file (``tokenizer.json``): its model's type, its vocabulary (each id and its
  token), a BPE's merges and the added tokens (each id and its content); not the file's path, its
  time, its JSON layout (a merge written ``"a b"`` or ``["a", "b"]``, as ``tokenizers`` releases
  differ), nor what only changes how text is cut (normalizer, pre-tokenizer, truncation, padding);
- dew's byte tokenizer: the content of its Hugging Face form (``dew-export`` writes it as a BPE
  without merges over GPT-2's 256 byte-level symbols, each symbol's id its byte, and
  ``<|endoftext|>`` 256), so a byte run's exported directory and byte data are the same tokenizer.

Plain JSON and hashlib: the ``tokenizers`` library is not loaded to read an identity. This module
imports nothing else from dew.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping

EOS = "<|endoftext|>"
"""The end-of-text token of dew's tokenizers (``dew.data.tokenizer``), id 256 of the byte one."""


def byte_symbols() -> list[str]:
    """GPT-2's byte-level alphabet: the printable character each byte 0..255 is written as
    (``bytes_to_unicode``: printable Latin-1 bytes stand for themselves, the others for 256 + n)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols, extra = {}, 0
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


@dataclasses.dataclass(frozen=True)
class TokenizerIdentity:
    """A tokenizer as identified: two are the same tokenizer when their digests are equal; the kind
    and the vocabulary are for the message that names them."""

    digest: str
    """SHA-256 (hex) of the canonical content."""
    kind: str = dataclasses.field(compare=False)
    """The record's kind: ``byte``, ``bpe`` or ``pretrained``."""
    vocab: int = dataclasses.field(compare=False)
    """The ids the tokenizer gives (its vocabulary and added tokens)."""

    def __str__(self) -> str:
        if self.kind == "byte":
            return f"bytes (vocab {self.vocab})"
        return f"{self.kind} (vocab {self.vocab}, digest {self.digest[:12]})"


@dataclasses.dataclass(frozen=True)
class Canonical:
    """What of a ``tokenizers`` file gives its ids their meaning, in one layout."""

    type: str
    """The model's type (``BPE``, ``Unigram``, ``WordPiece``, ``WordLevel``)."""
    vocab: list[tuple[int, str]]
    """Each id of the vocabulary and its token, in id order."""
    merges: list[list[str]]
    """A BPE's merges, each a pair (empty for other models)."""
    added_tokens: list[tuple[int, str]]
    """Each added token's id and content, in id order."""

    def identity(self, kind: str) -> TokenizerIdentity:
        text = json.dumps(dataclasses.asdict(self), ensure_ascii=False, separators=(",", ":"))
        ids = {i for i, _ in self.vocab} | {i for i, _ in self.added_tokens}
        return TokenizerIdentity(hashlib.sha256(text.encode("utf-8")).hexdigest(), kind, len(ids))


def canonical(content: Mapping[str, object]) -> Canonical:
    """The canonical content of a ``tokenizer.json`` (parsed): its vocabulary (a Unigram's list: its
    pieces by position), merges written as pairs, added tokens by id."""
    model = content.get("model")
    if not isinstance(model, Mapping):
        raise ValueError("not a tokenizers file: it holds no 'model'")
    vocab = model.get("vocab") or {}
    if isinstance(vocab, Mapping):
        entries = sorted((int(i), str(t)) for t, i in vocab.items())
    else:  # Unigram: [[piece, score], ...], the id is the position
        entries = [(i, str(piece[0])) for i, piece in enumerate(vocab)]
    merges = [m.split(" ", 1) if isinstance(m, str) else [str(a) for a in m] for m in model.get("merges") or []]
    added_tokens = content.get("added_tokens") or []
    if not isinstance(added_tokens, list):
        raise ValueError(f"added_tokens={added_tokens!r} is not a list")
    added = sorted((int(t["id"]), str(t["content"])) for t in added_tokens)
    return Canonical(str(model.get("type")), entries, merges, added)


def byte_identity() -> TokenizerIdentity:
    """dew's byte tokenizer, identified as its Hugging Face form (module docstring)."""
    return Canonical("BPE", list(enumerate(byte_symbols())), [], [(256, EOS)]).identity("byte")


def file_identity(path: str, kind: str = "pretrained") -> TokenizerIdentity:
    """The tokenizer of the ``tokenizer.json`` at ``path``; ``kind`` names it in messages."""
    with open(path, encoding="utf-8") as f:
        try:
            content = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
    try:
        return canonical(content).identity(kind)
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"{path}: {e}") from None


def identity(record: Mapping[str, object]) -> TokenizerIdentity:
    """The tokenizer a sidecar's ``tokenizer`` record names (its ``file`` resolved)."""
    kind = str(record.get("kind"))
    if kind == "byte":
        return byte_identity()
    if "file" not in record:
        raise ValueError(f"tokenizer record {dict(record)}: kind={kind!r} names no file")
    return file_identity(str(record["file"]), kind)
