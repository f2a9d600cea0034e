"""``dew-prepare``: turn text into a token file that ``token_windows`` reads.

    dew-prepare --out data/tiny corpus/*.txt                     # UTF-8 bytes, vocabulary 257
    dew-prepare --out data/tiny --tokenizer bpe --vocab-size 4096 --val held_out.txt corpus/*.txt
    dew-prepare --out data/llama --tokenizer path/to/model corpus/*.txt          # a pretrained tokenizer
    dew-prepare --out data/web --hf path/to/saved_dataset --field text --val-split test  # a Hugging Face dataset
    dew-prepare --out data/web --jsonl 'web/*.jsonl' --val 'held_out/*.jsonl'           # data files

writes ``<out>/train.bin`` (and ``<out>/val.bin`` with ``--val``) as llm.c shards, every document
(an input file, or a record of a dataset) followed by the end-of-text id, and the sidecar
``<out>/tokens.json`` with the vocabulary size and the tokenizer (a BPE is trained on the training
files and saved as ``<out>/tokenizer.json``; a pretrained tokenizer's files are copied there). Then
``dew-train data=token_windows data.path=<out>/train.bin data.val_path=<out>/val.bin``. ``hf_text``'s
cache is written by the same code (``write_token_dir``).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np

from dew.commandline.console import console_script
from dew.data.hf_sources import Source, resolve, texts
from dew.data.token_files import SIDECAR, write_llmc
from dew.data.tokenizer import ByteTokenizer, Tokenizer, copy_files, encode_documents, load_tokenizer, train_bpe


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        try:
            return f.read()
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text ({e})") from e


def file_documents(paths: Sequence[str], tokenizer: Tokenizer) -> Iterator[np.ndarray]:
    """Each text file as one document: its ids, framed (``dew.data.tokenizer.document``)."""
    for path in paths:
        yield from encode_documents(tokenizer, [_read(path)])


def source_documents(source: Source, tokenizer: Tokenizer) -> Iterator[np.ndarray]:
    """Each record of ``source`` as one document, in stored order, encoded a batch of records at a time."""
    for batch in texts(source):
        yield from encode_documents(tokenizer, batch)


def write_token_dir(
    out: str,
    tokenizer: Tokenizer,
    parts: Mapping[str, Iterable[np.ndarray]],
    sources: Mapping[str, object],
    extra: Mapping[str, object] | None = None,
) -> dict:
    """Write each of ``parts`` (``train.bin``, ``val.bin``: documents of ids) as an llm.c shard in
    ``out``, the tokenizer's files, and the sidecar last (so a sidecar names complete files), with
    ``extra`` fields; return the sidecar record."""
    os.makedirs(out, exist_ok=True)
    copy_files(tokenizer, out)
    files_written: dict[str, dict[str, object]] = {}
    record = {
        "format": "dew-tokens",
        "version": 1,
        "vocab_size": tokenizer.vocab_size,
        "tokenizer": tokenizer.record(),
        "files": files_written,
        **(extra or {}),
    }
    for name, documents in parts.items():
        count = write_llmc(os.path.join(out, name), documents, tokenizer.vocab_size)
        files_written[name] = {"tokens": count, "sources": sources[name]}
    tmp = os.path.join(out, f"{SIDECAR}.tmp")
    with open(tmp, "w") as f:
        json.dump(record, f, indent=2)
    os.replace(tmp, os.path.join(out, SIDECAR))
    return record


def choose_tokenizer(name: str, vocab_size: int, train_files: Sequence[str], out: str) -> Tokenizer:
    """``byte``, ``bpe`` (trained on ``train_files``, saved in ``out``) or a pretrained tokenizer's path."""
    if name == "byte":
        return ByteTokenizer()
    if name == "bpe":
        if not train_files:
            raise ValueError(
                "--tokenizer bpe trains on text files; for a dataset give a trained or pretrained tokenizer"
            )
        os.makedirs(out, exist_ok=True)
        return train_bpe(train_files, vocab_size, os.path.join(out, "tokenizer.json"))
    return load_tokenizer(name, "--tokenizer")


def prepare(
    files: Sequence[str], out: str, *, tokenizer: str = "byte", vocab_size: int = 4096, val: Sequence[str] = ()
) -> dict:
    """Tokenize the text ``files`` (and ``val``) into ``out``; return the sidecar record written."""
    for path in [*files, *val]:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"input text file {path} does not exist")
    if not files:
        raise ValueError("give at least one text file to tokenize")
    tok = choose_tokenizer(tokenizer, vocab_size, files, out)
    parts = {"train.bin": file_documents(files, tok)}
    sources: dict[str, object] = {"train.bin": list(files)}
    if val:
        parts["val.bin"], sources["val.bin"] = file_documents(val, tok), list(val)
    return write_token_dir(out, tok, parts, sources)


def prepare_source(source: Source, out: str, *, tokenizer: str = "byte", val: Source | None = None) -> dict:
    """Tokenize the records of a dataset ``source`` (and ``val``) into ``out``; return the sidecar record."""
    for checked in (source, val):
        if checked is not None:
            checked.open()  # a missing field or an empty split fails here, before anything is written
    tok = choose_tokenizer(tokenizer, 0, [], out)
    parts = {"train.bin": source_documents(source, tok)}
    sources: dict[str, object] = {"train.bin": str(source)}
    if val is not None:
        parts["val.bin"], sources["val.bin"] = source_documents(val, tok), str(val)
    return write_token_dir(out, tok, parts, sources)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dew-prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="UTF-8 text files to train on (one document each)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--tokenizer",
        default="byte",
        help="byte: UTF-8 bytes (vocabulary 257); bpe: train a byte-level BPE on the files; or a tokenizer.json, "
        "a Hugging Face model directory holding one, or a tokens.json sidecar",
    )
    parser.add_argument(
        "--vocab-size", type=int, default=4096, help="vocabulary of the trained BPE, ids (default 4096)"
    )
    parser.add_argument("--val", nargs="*", default=[], help="held-out text files -> val.bin")
    source = parser.add_argument_group("a Hugging Face dataset instead of text files (one document per record)")
    source.add_argument(
        "--hf",
        metavar="DIR_OR_NAME",
        help="a save_to_disk directory, a dataset repository, or a hub name in the local cache",
    )
    source.add_argument("--jsonl", metavar="GLOB", help="JSON-lines files")
    source.add_argument("--parquet", metavar="GLOB", help="Parquet files")
    source.add_argument("--field", default="text", help="the column holding the text (default text)")
    source.add_argument("--split", default="train", help="the split to tokenize (--hf; default train)")
    source.add_argument("--subset", default=None, help="a hub dataset's configuration (--hf)")
    source.add_argument("--val-split", default=None, help="a split of the same dataset -> val.bin (--hf)")
    return parser


def _run(args: argparse.Namespace) -> dict:
    given = [
        (flag, value)
        for flag, value in (("--hf", args.hf), ("--jsonl", args.jsonl), ("--parquet", args.parquet))
        if value
    ]
    if not given:
        if not args.files:
            raise ValueError("give text files, or a dataset with --hf, --jsonl or --parquet")
        return prepare(args.files, args.out, tokenizer=args.tokenizer, vocab_size=args.vocab_size, val=args.val)
    if len(given) > 1 or args.files:
        named = [flag for flag, _ in given] + (["text files"] if args.files else [])
        raise ValueError(f"{' and '.join(named)} each name the text to tokenize: give one")
    flag, path = given[0]
    fmt = {"--jsonl": "json", "--parquet": "parquet"}.get(flag, "auto")
    source = resolve(path, split=args.split, field=args.field, subset=args.subset, fmt=fmt, what=flag)
    val = None
    if args.val_split:
        val = resolve(path, split=args.val_split, field=args.field, subset=args.subset, fmt=fmt, what=flag)
    elif args.val:
        if len(args.val) > 1:
            raise ValueError(f"--val with {flag} takes one path or glob of data files, not {len(args.val)}")
        val = resolve(args.val[0], field=args.field, fmt=fmt, what="--val")
    return prepare_source(source, args.out, tokenizer=args.tokenizer, val=val)


@console_script
def main(argv: Sequence[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        record = _run(args)
    except (OSError, ValueError) as e:
        parser.exit(1, f"dew-prepare: error: {e}\n")
    counts = ", ".join(f"{k}: {v['tokens']} tokens" for k, v in record["files"].items())
    print(f"wrote {args.out}: {counts}; vocab_size {record['vocab_size']}")


if __name__ == "__main__":
    main()
