"""``hf_text``: text from a Hugging Face dataset, tokenized and packed into windows of ``seq_len + 1``.

Two modes (``data.mode``):

- **cache** (the default): the source is tokenized once into the token files ``token_windows``
  reads (``train.bin``, ``val.bin``, ``tokens.json`` and the tokenizer's files), written by
  ``dew-prepare``'s own code (``dew.data.prepare.write_token_dir``), in
  ``<cache>/hf_text/<key>/``. The key is a digest of the source (its files' paths, sizes and
  modification times, or a hub dataset's fingerprint), the split, the field and the tokenizer (its
  record and the bytes of its files): another run, another process or ``seq_len`` reads the same
  cache. One process builds it while the others wait on the lock beside it
  (``dew.contract.lock.RunLock``); it is written under a temporary name and renamed into place whole,
  and one that does not read back whole (a sidecar missing or from another key, a shard whose size
  disagrees with its header) is built again, never half-read. Then it is ``token_windows``: windows
  advancing by ``seq_len`` over the cached ids, shuffled per epoch, every window once per epoch,
  sharded and resumed by one global position (``dew.data.pipeline``). With ``data.documents``, each
  record is a document packed whole into the windows (``dew.data.packing``).
- **stream**: records read, tokenized and packed as the run goes, each process its own share:
  ``dew.data.hf_stream``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from typing import TYPE_CHECKING

from dew.contract.lock import RunLock, RunLockedError
from dew.data.hf_sources import Source, resolve
from dew.data.hf_stream import StreamedText
from dew.data.packing import Framing, targets_per_record
from dew.data.prepare import source_documents, write_token_dir
from dew.data.token_files import SIDECAR, open_tokens, read_sidecar
from dew.data.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer
from dew.data.tokens import TokenDataset, split_windows

if TYPE_CHECKING:
    from dew.data.fields import HFTextFields

log = logging.getLogger("dew")

CACHE_VERSION = 1
"""Part of every cache key: a change of what a cache holds makes new ones."""
_WAIT_S = 0.1


# ------------------------------------------------------------------------------ the token cache


def cache_root(spec: HFTextFields) -> str:
    """``<cache>/hf_text``: ``data.cache_dir``, else ``$DEW_DATA_DIR``, else ``~/.cache/dew/datasets``."""
    base = spec.cache_dir or os.environ.get("DEW_DATA_DIR") or "~/.cache/dew/datasets"
    return os.path.join(os.path.expanduser(base), "hf_text")


def tokenizer_identity(tokenizer: Tokenizer) -> dict[str, object]:
    """The tokenizer's record and a digest of its files' bytes: a retrained tokenizer keys a new cache."""
    record: dict[str, object] = tokenizer.record()
    if not isinstance(tokenizer, ByteTokenizer):
        with open(tokenizer.file, "rb") as f:
            record["sha256"] = hashlib.sha256(f.read()).hexdigest()
    return record


def cache_key(spec: HFTextFields, tokenizer: Tokenizer, train: Source, val: Source | None) -> str:
    """The digest that names a cache: what it was built from, and how."""
    described = {
        "version": CACHE_VERSION,
        "field": spec.field,
        "train": train.identity(),
        "val": None if val is None else val.identity(),
        "tokenizer": tokenizer_identity(tokenizer),
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:24]


def intact(directory: str, key: str) -> bool:
    """Whether ``directory`` holds a whole cache of ``key``: its sidecar names the key, and every
    shard it lists opens (the header agrees with the size) with the count it lists."""
    try:
        with open(os.path.join(directory, SIDECAR)) as f:
            record = json.load(f)
        if record.get("key") != key:
            return False
        for name, info in record["files"].items():
            if len(open_tokens(os.path.join(directory, name), "llmc")) != info["tokens"]:
                return False
        return True
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def build_cache(directory: str, key: str, tokenizer: Tokenizer, train: Source, val: Source | None) -> None:
    """Tokenize ``train`` (and ``val``) into ``directory``: written under a temporary name, renamed into
    place whole; a damaged cache there is set aside and removed first."""
    tmp = f"{directory}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    parts = {"train.bin": source_documents(train, tokenizer)}
    sources: dict[str, object] = {"train.bin": str(train)}
    if val is not None:
        parts["val.bin"], sources["val.bin"] = source_documents(val, tokenizer), str(val)
    try:
        write_token_dir(tmp, tokenizer, parts, sources, {"key": key})
        if os.path.exists(directory):
            aside = f"{directory}.damaged-{uuid.uuid4().hex[:8]}"
            log.warning("%s: the token cache does not read back whole; building it again", directory)
            os.replace(directory, aside)
            shutil.rmtree(aside, ignore_errors=True)
        os.replace(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cached_tokens(spec: HFTextFields, tokenizer: Tokenizer, train: Source, val: Source | None) -> str:
    """The directory of the token cache of ``spec``'s source: found whole, or built by this process
    under the cache's lock while any other waits for it."""
    key = cache_key(spec, tokenizer, train, val)
    directory = os.path.join(cache_root(spec), key)
    said = False
    while not intact(directory, key):
        try:
            lock = RunLock(f"{directory}.lock").acquire()
        except RunLockedError:
            if not said:
                log.info("%s: another process is building the token cache; waiting for it", directory)
                said = True
            time.sleep(_WAIT_S)
            continue
        built = False
        try:
            if not intact(directory, key):
                log.info("%s: tokenizing %s into the token cache", directory, train)
                build_cache(directory, key, tokenizer, train, val)
            built = True
        finally:
            lock.release()
            if not built:  # a failed build leaves the cache as it found it (a waiter takes a new lock)
                shutil.rmtree(f"{directory}.lock", ignore_errors=True)
    return directory


# ------------------------------------------------------------------------------ loading


def sources(spec: HFTextFields) -> tuple[Source, Source | None]:
    """The split that trains and the held-out one (None without ``val_split``/``val_path``)."""
    train = resolve(spec.path, split=spec.split, field=spec.field, subset=spec.subset, fmt=spec.format)
    val = None
    if spec.val_split:
        val = resolve(spec.path, split=spec.val_split, field=spec.field, subset=spec.subset, fmt=spec.format)
    elif spec.val_path:
        val = resolve(spec.val_path, field=spec.field, fmt=spec.format, what="data.val_path")
    return train, val


def cached_windows(spec: HFTextFields, directory: str, batch_size: int, seed: int) -> TokenDataset:
    """``token_windows`` over the cache in ``directory``: the held-out windows those of ``val.bin``, or
    the last ``val_fraction`` of ``train.bin``'s."""
    sidecar = read_sidecar([os.path.join(directory, "train.bin")])
    train_ids = open_tokens(os.path.join(directory, "train.bin"), "llmc")
    val_ids = [open_tokens(os.path.join(directory, "val.bin"), "llmc")] if "val.bin" in sidecar["files"] else []
    documents = Framing.of(sidecar["tokenizer"], f"data.path={spec.path!r}") if spec.documents else None
    train, held_out = split_windows([train_ids], val_ids, spec.seq_len, spec.val_fraction, documents)
    for split, records in (("training", train), ("held-out", held_out)):
        if records is not None and records.num_records < 1:
            raise ValueError(
                f"data.path={spec.path!r}: the {split} text holds no window of data.seq_len={spec.seq_len} + 1 tokens "
                f"({len(train_ids)} tokens in all)"
            )
    return TokenDataset(
        name=spec.name,
        train=train,
        held_out=held_out,
        batch_size=batch_size,
        seed=seed,
        fields={"vocab_size": sidecar["vocab_size"], "seq_len": spec.seq_len},
        tokens_per_record=targets_per_record(train, spec.seq_len),
        tokenizer=sidecar["tokenizer"],
    )


def load_hf_text(spec: HFTextFields, batch_size: int, seed: int) -> TokenDataset | StreamedText:
    """``spec``'s text at global batch ``batch_size``: windows over its token cache, or the stream."""
    tokenizer = load_tokenizer(spec.tokenizer, "data.tokenizer")
    train, val = sources(spec)
    if spec.mode == "stream":
        return StreamedText(spec, train, val, tokenizer, batch_size, seed)
    return cached_windows(spec, cached_tokens(spec, tokenizer, train, val), batch_size, seed)
