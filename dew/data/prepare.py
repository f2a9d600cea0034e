"""``dew-prepare``: turn text files into a token file that ``token_windows`` reads.

    dew-prepare --out data/tiny corpus/*.txt                     # UTF-8 bytes, vocabulary 257
    dew-prepare --out data/tiny --tokenizer bpe --vocab-size 4096 --val held_out.txt corpus/*.txt

writes ``<out>/train.bin`` (and ``<out>/val.bin`` with ``--val``) as llm.c shards, every document
(input file) followed by the end-of-text id, and the sidecar ``<out>/tokens.json`` with the
vocabulary size and the tokenizer (a BPE is trained on the training files and saved as
``<out>/tokenizer.json``). Then ``dew-train data=token_windows data.path=<out>/train.bin
data.val_path=<out>/val.bin``.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator, Sequence

import numpy as np

from dew.cli.console import console_script
from dew.data.token_files import SIDECAR, write_llmc
from dew.data.tokenizer import ByteTokenizer, Tokenizer, train_bpe


def _documents(paths: Sequence[str], tokenizer: Tokenizer) -> Iterator[np.ndarray]:
    eos = np.array([tokenizer.eos_id], np.int32)
    for path in paths:
        with open(path, encoding="utf-8") as f:
            try:
                text = f.read()
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}: not UTF-8 text ({e})") from e
        yield tokenizer.encode(text)
        yield eos


def prepare(
    files: Sequence[str], out: str, *, tokenizer: str = "byte", vocab_size: int = 4096, val: Sequence[str] = ()
) -> dict:
    """Tokenize ``files`` (and ``val``) into ``out``; return the sidecar record written."""
    for path in [*files, *val]:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"input text file {path} does not exist")
    if not files:
        raise ValueError("give at least one text file to tokenize")
    os.makedirs(out, exist_ok=True)
    if tokenizer == "byte":
        tok: Tokenizer = ByteTokenizer()
    elif tokenizer == "bpe":
        tok = train_bpe(files, vocab_size, os.path.join(out, "tokenizer.json"))
    else:
        raise ValueError(f"--tokenizer={tokenizer!r} must be 'byte' or 'bpe'")
    files_written: dict[str, dict[str, object]] = {}
    record = {
        "format": "dew-tokens",
        "version": 1,
        "vocab_size": tok.vocab_size,
        "tokenizer": tok.record(),
        "files": files_written,
    }
    for name, paths in (("train.bin", files), ("val.bin", val)):
        if paths:
            count = write_llmc(os.path.join(out, name), _documents(paths, tok), tok.vocab_size)
            files_written[name] = {"tokens": count, "sources": list(paths)}
    tmp = os.path.join(out, f"{SIDECAR}.tmp")
    with open(tmp, "w") as f:
        json.dump(record, f, indent=2)
    os.replace(tmp, os.path.join(out, SIDECAR))
    return record


@console_script
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="dew-prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="UTF-8 text files to train on (one document each)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--tokenizer",
        choices=("byte", "bpe"),
        default="byte",
        help="byte: UTF-8 bytes (vocabulary 257); bpe: train a byte-level BPE",
    )
    parser.add_argument(
        "--vocab-size", type=int, default=4096, help="vocabulary of the trained BPE, ids (default 4096)"
    )
    parser.add_argument("--val", nargs="*", default=[], help="held-out text files -> val.bin")
    args = parser.parse_args(argv)
    try:
        record = prepare(args.files, args.out, tokenizer=args.tokenizer, vocab_size=args.vocab_size, val=args.val)
    except (OSError, ValueError) as e:
        parser.exit(1, f"dew-prepare: error: {e}\n")
    counts = ", ".join(f"{k}: {v['tokens']} tokens" for k, v in record["files"].items())
    print(f"wrote {args.out}: {counts}; vocab_size {record['vocab_size']}")


if __name__ == "__main__":
    main()
