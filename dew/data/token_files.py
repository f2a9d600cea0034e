"""Reading token files: raw uint16/uint32, ``.npy``, llm.c shards, and the sidecar JSON.

Every reader returns a read-only memory map of the file's token ids, so a token file of any size
costs nothing to open. The formats:

- raw: the ids back to back, little-endian ``uint16`` or ``uint32`` (``data.dtype``);
- ``.npy``: a one-dimensional unsigned (or non-negative signed) integer array;
- llm.c / modded-nanogpt shards: a header of 256 little-endian int32 (``[0]`` the magic 20240520,
  ``[1]`` the version: 1 for uint16 ids, 2 for uint32 ids as in llm.c's LLaMA-3 shards, ``[2]`` the
  token count), then the ids.

The sidecar ``tokens.json`` (written by ``dew-prepare``, see ``dew.data.prepare``) lives in the
directory of the token files and says how to read them back into text::

    {"format": "dew-tokens", "version": 1, "vocab_size": 257,
     "tokenizer": {"kind": "byte", "eos_id": 256}}        # or {"kind": "bpe", "file": "tokenizer.json", ...}
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from dew.data.tokenizer_identity import identity

LLMC_MAGIC = 20240520
LLMC_HEADER_INTS = 256
LLMC_HEADER_BYTES = LLMC_HEADER_INTS * 4
LLMC_VERSIONS: dict[int, np.dtype] = {1: np.dtype("<u2"), 2: np.dtype("<u4")}
SIDECAR = "tokens.json"
_CHUNK = 1 << 24  # tokens scanned at a time by the vocabulary check (32-64 MB)


MAKE_TOKENS = (
    "make one from text files with: dew-prepare --out data/tiny corpus/*.txt (then data.path=data/tiny/train.bin)"
)
"""How to make a token file, for the errors that find none."""


def expand(pattern: str, field: str, *, how: str | None = None) -> list[str]:
    """The files ``pattern`` names (a path or a glob), sorted; an error naming ``field`` if none,
    ending with ``how`` to make one when given."""
    if not pattern:
        raise ValueError(f"{field} is empty: give a token file or a glob over shards" + (f"; {how}" if how else ""))
    paths = sorted(glob.glob(os.path.expanduser(pattern)))
    paths = [p for p in paths if os.path.isfile(p)]
    if not paths:
        raise FileNotFoundError(f"{field}={pattern!r} matches no file")
    return paths


def _llmc_header(path: str) -> np.ndarray | None:
    with open(path, "rb") as f:
        head = f.read(LLMC_HEADER_BYTES)
    if len(head) < 4 or int(np.frombuffer(head[:4], "<i4")[0]) != LLMC_MAGIC:
        return None
    if len(head) < LLMC_HEADER_BYTES:
        raise ValueError(f"{path}: llm.c header truncated ({len(head)} of {LLMC_HEADER_BYTES} bytes)")
    return np.frombuffer(head, "<i4")


def open_tokens(path: str, fmt: str = "auto", dtype: str = "uint16") -> np.ndarray:
    """The token ids of one file as a read-only one-dimensional memory map.

    ``fmt`` is ``auto`` (``.npy`` by its suffix, an llm.c shard by its magic, raw otherwise),
    ``raw``, ``npy`` or ``llmc``; ``dtype`` is the element type of a raw file.
    """
    if fmt == "npy" or (fmt == "auto" and path.endswith(".npy")):
        try:
            array = np.load(path, mmap_mode="r")
        except ValueError as e:
            raise ValueError(f"{path}: not a readable .npy file ({e})") from e
        if array.ndim != 1 or array.dtype.kind not in "ui":
            raise ValueError(
                f"{path}: a .npy token file must be a 1-D integer array, got shape {array.shape} dtype {array.dtype}"
            )
        return array
    header = _llmc_header(path) if fmt in ("auto", "llmc") else None
    if header is not None:
        version, count = int(header[1]), int(header[2])
        if version not in LLMC_VERSIONS:
            raise ValueError(
                f"{path}: llm.c header version {version} is not one of "
                f"{sorted(LLMC_VERSIONS)} (1: uint16 ids, 2: uint32 ids)"
            )
        item = LLMC_VERSIONS[version]
        expected = LLMC_HEADER_BYTES + count * item.itemsize
        size = os.path.getsize(path)
        if size != expected:
            raise ValueError(
                f"{path}: llm.c header says {count} tokens ({expected} bytes with the "
                f"header) but the file has {size} bytes: truncated or not a shard"
            )
        return np.memmap(path, dtype=item, mode="r", offset=LLMC_HEADER_BYTES, shape=(count,))
    if fmt == "llmc":
        with open(path, "rb") as f:
            first = f.read(4)
        magic = int(np.frombuffer(first, "<i4")[0]) if len(first) == 4 else None
        raise ValueError(f"{path}: wrong header: magic {magic} is not llm.c's {LLMC_MAGIC}")
    if dtype not in ("uint16", "uint32"):
        raise ValueError(f"data.dtype={dtype!r} must be uint16 or uint32")
    item = np.dtype(dtype).newbyteorder("<")
    size = os.path.getsize(path)
    if size % item.itemsize:
        raise ValueError(f"{path}: {size} bytes is not a whole number of {dtype} tokens")
    if size == 0:
        raise ValueError(f"{path}: the token file is empty")
    return np.memmap(path, dtype=item, mode="r")


def check_vocabulary(path: str, tokens: np.ndarray, vocab_size: int) -> None:
    """Raise if an id of ``tokens`` (read from ``path``) lies outside [0, vocab_size), naming the
    first one's token offset. Reads the file once, a chunk at a time."""
    for start in range(0, len(tokens), _CHUNK):
        chunk = np.asarray(tokens[start : start + _CHUNK])
        bad = (chunk >= vocab_size) | (chunk < 0) if chunk.dtype.kind == "i" else chunk >= vocab_size
        if bad.any():
            at = int(np.argmax(bad))
            raise ValueError(
                f"{path}: token id {int(chunk[at])} at token offset {start + at} lies "
                f"outside the vocabulary [0, {vocab_size})"
            )


def sidecar_record(directory: str) -> dict | None:
    """The ``tokens.json`` in ``directory`` as read (its tokenizer's ``file`` resolved against the
    directory, for readers elsewhere); None where there is none."""
    sidecar = os.path.join(directory, SIDECAR)
    if not os.path.isfile(sidecar):
        return None
    with open(sidecar) as f:
        try:
            record = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{sidecar}: not valid JSON ({e})") from e
    tokenizer = record.get("tokenizer")
    if isinstance(tokenizer, dict) and "file" in tokenizer:
        record = {**record, "tokenizer": {**tokenizer, "file": os.path.join(directory, tokenizer["file"])}}
    return record


def read_sidecar(paths: Sequence[str]) -> dict:
    """The ``tokens.json`` beside ``paths`` (one per directory; all must agree: on the vocabulary size,
    and on the tokenizer where they name one, as ``dew.data.tokenizer_identity`` identifies it)."""
    records = {}
    for directory in sorted({os.path.dirname(os.path.abspath(p)) for p in paths}):
        sidecar = os.path.join(directory, SIDECAR)
        record = sidecar_record(directory)
        if record is None:
            raise FileNotFoundError(
                f"data.vocab_size is unset and {sidecar} does not exist: set data.vocab_size or "
                "write the sidecar with dew-prepare"
            )
        vocab = record.get("vocab_size")
        if not isinstance(vocab, int) or vocab < 1:
            raise ValueError(f"{sidecar}: vocab_size={vocab!r} must be a positive int")
        records[sidecar] = record
    vocabs = {k: r["vocab_size"] for k, r in records.items()}
    if len(set(vocabs.values())) > 1:
        raise ValueError(f"the token files' sidecars disagree on vocab_size: {vocabs}")
    if len(records) > 1:  # files of two tokenizers of one vocabulary size: the same ids mean other text
        named = {k: identity(r["tokenizer"]) for k, r in records.items() if isinstance(r.get("tokenizer"), dict)}
        if len(set(named.values())) > 1:
            raise ValueError(
                "the token files' sidecars name different tokenizers (the same ids mean other text): "
                + "; ".join(f"{k}: {v}" for k, v in named.items())
            )
    return next(iter(records.values()))


def refuse_other_sidecars(paths: Sequence[str], record: Mapping[str, object], field: str) -> None:
    """Refuse token files whose ``tokens.json`` names another tokenizer than ``record`` (the one
    ``field`` names, ``file`` resolved): the ids were made by the sidecar's. Files without a sidecar,
    or whose sidecar names none, are taken as ``field`` says."""
    want = None
    for directory in sorted({os.path.dirname(os.path.abspath(p)) for p in paths}):
        named = (sidecar_record(directory) or {}).get("tokenizer")
        if not isinstance(named, dict):
            continue
        sidecar = os.path.join(directory, SIDECAR)
        want = want or identity(record)
        if (got := identity(named)) != want:
            raise ValueError(
                f"{field} is {want}, but {sidecar} says its token files were made by {got}: set {field} "
                "to the files' tokenizer, or drop it to read theirs"
            )


def write_llmc(path: str, chunks: Iterable[np.ndarray], vocab_size: int) -> int:
    """Write ``chunks`` of ids back to back as one llm.c shard and return the token count.

    Ids are uint16 (version 1) when ``vocab_size`` allows, uint32 (version 2) otherwise. The file
    is written under a temporary name and renamed when complete, so a reader never sees half.
    """
    dtype = np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")
    header = np.zeros(LLMC_HEADER_INTS, "<i4")
    header[0], header[1] = LLMC_MAGIC, 1 if dtype.itemsize == 2 else 2
    tmp = f"{path}.tmp-{os.getpid()}"
    count = 0
    try:
        with open(tmp, "wb") as f:
            f.write(header.tobytes())
            for chunk in chunks:
                f.write(np.asarray(chunk, dtype).tobytes())
                count += len(chunk)
            header[2] = count
            f.seek(0)
            f.write(header.tobytes())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return count
