"""Does the shipped ``experiment=tiny_lm`` beat a general-purpose compressor on held-out text?

The corpus is the Python standard library's own modules (the ``.py`` files of the interpreter that
runs this, without its tests, ``idlelib``, ``lib2to3``, ``site-packages`` and the generated
``encodings`` codec tables and ``pydoc_data`` topics). A split holds out whole top-level modules and
packages, drawn by ``--seed`` until they hold ``--held-out`` of the bytes; the rest is the training
text. For each split the bench runs the commands a user runs, as written in the preset's comment:

    dew-prepare --out DIR/tokens --tokenizer bpe --vocab-size 1024 TRAIN_FILES... --val HELD_OUT_FILES...
    dew-train experiment=tiny_lm data.path=DIR/tokens/train.bin data.val_path=DIR/tokens/val.bin data.val_fraction=0
    dew-eval DIR/checkpoints/NAME --latest

(the byte-level BPE trained on the training files alone), then reads the held-out bits per byte
from dew-eval's record (every held-out window, one pass: the loss over the bytes its scored tokens
decode to), and compresses the same held-out files, concatenated as dew-prepare reads them, with
``bzip2 -9`` and ``xz -9`` (Python's ``bz2`` and ``lzma`` modules, the same formats and presets as the
command-line tools). The training time is the run's own (``train`` in its end line: compilation,
evaluation and checkpoints not included) and the whole training command's wall time is reported
beside it. The last line is the JSON record.

    JAX_PLATFORMS=cpu python bench/tiny_lm_bzip2.py --seeds 1 2 3            # three splits, as shipped
    JAX_PLATFORMS=cpu python bench/tiny_lm_bzip2.py --seeds 7 trainer.steps=300   # a quick look
    JAX_PLATFORMS=cpu python bench/tiny_lm_bzip2.py --tokenizer byte          # UTF-8 bytes instead of the BPE

Arguments after the options are dew-train overrides added to the preset's (a search's trial, a
shorter run).
"""

from __future__ import annotations

import argparse
import bz2
import json
import lzma
import os
import random
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

LEFT_OUT = ("site-packages", "test", "tests", "idlelib", "lib2to3", "encodings", "pydoc_data", "__pycache__")
"""Top-level names of the standard library not in the corpus: tests, two tools, generated tables."""


def modules(root: Path) -> dict[str, list[Path]]:
    """The corpus's ``.py`` files by top-level module or package name, sorted."""
    out: dict[str, list[Path]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if parts[0] in LEFT_OUT or parts[0].startswith("config-") or "tests" in parts or "test" in parts:
            continue
        top = parts[0].removesuffix(".py")
        out.setdefault(top, []).append(path)
    return out


def split(corpus: dict[str, list[Path]], seed: int, share: float) -> tuple[list[Path], list[Path], list[str]]:
    """(training files, held-out files, held-out module names): whole modules drawn by ``seed`` until
    they hold ``share`` of the corpus's bytes."""
    size = {name: sum(p.stat().st_size for p in files) for name, files in corpus.items()}
    order = sorted(corpus)
    random.Random(seed).shuffle(order)
    held, total = [], sum(size.values())
    for name in order:
        if sum(size[n] for n in held) >= share * total:
            break
        if size[name] <= share * total:  # a module bigger than the share alone is never the whole split
            held.append(name)
    train = [p for name in sorted(corpus) if name not in held for p in corpus[name]]
    val = [p for name in sorted(held) for p in corpus[name]]
    return train, val, sorted(held)


def compressed_bits_per_byte(files: list[Path]) -> dict[str, float]:
    """``bzip2 -9`` and ``xz -9`` of the files concatenated, in bits per byte of the text."""
    data = b"".join(p.read_bytes() for p in files)
    return {
        "bytes": len(data),
        "bzip2_9": 8 * len(bz2.compress(data, 9)) / len(data),
        "xz_9": 8 * len(lzma.compress(data, preset=9)) / len(data),
    }


def dew(module: str, args: list[str], cwd: Path, log: Path) -> float:
    """Run a dew command (``python -m module args``) in ``cwd``, its output appended to ``log``: its
    wall time. A failed command ends the bench with its output's tail."""
    began = time.monotonic()
    with open(log, "a") as out:
        done = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        sys.exit(f"{module} {' '.join(args)} failed ({done.returncode}):\n{log.read_text()[-3000:]}")
    return time.monotonic() - began


def one_split(seed: int, share: float, tokenizer: list[str], overrides: list[str], work: Path) -> dict:
    from dew.contract.journal import read_journal

    corpus = modules(Path(sysconfig.get_paths()["stdlib"]))
    train, val, held = split(corpus, seed, share)
    work.mkdir(parents=True, exist_ok=True)
    log = work / "commands.log"
    files = [str(p) for p in train] + ["--val", *map(str, val)]
    dew("dew.data.prepare", ["--out", "tokens", *tokenizer, *files], work, log)
    name = f"tiny_lm_split{seed}"
    wall = dew(
        "dew.cli.train",
        [
            "experiment=tiny_lm",
            "data.path=tokens/train.bin",
            "data.val_path=tokens/val.bin",
            "data.val_fraction=0",
            f"trainer.name={name}",
            *overrides,
        ],
        work,
        log,
    )
    # The held-out bytes' bits as dew-eval gives them (the last step, every held-out window once):
    # the loss over the bytes the scored tokens decode to, whatever the tokenizer.
    dew("dew.cli.eval", [f"checkpoints/{name}", "--latest", "--out", "held_out.json"], work, log)
    held_out = json.loads((work / "held_out.json").read_text())
    records = read_journal(work / "tracking" / name / "journal.jsonl")
    (end,) = [r for r in records if r.get("event") == "end"]
    # The end line: "run NAME finished at step N in 9.8 min: compile 2.1 s, train 9.6 min, eval ..."
    ends = re.findall(rf"run {name} finished at step \d+ in .*?: compile .*?, train ([\d.]+) (s|min)", log.read_text())
    train_s = [float(v) * (60 if unit == "min" else 1) for v, unit in ends]
    return {
        "seed": seed,
        "held_out_modules": held,
        "train_bytes": sum(p.stat().st_size for p in train),
        **compressed_bits_per_byte(val),
        "tiny_lm_bits_per_byte": held_out["metrics"]["eval/bits_per_byte"],
        "bytes_per_token": held_out["metrics"]["eval/bytes_per_token"],
        "step": end["step"],
        "train_min": round(train_s[-1] / 60, 2) if train_s else None,
        "command_min": round(wall / 60, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="one split per seed")
    parser.add_argument("--held-out", type=float, default=0.05, help="share of the corpus's bytes held out")
    parser.add_argument("--keep", default=None, help="work in this directory and keep it (default: a temporary one)")
    parser.add_argument("--tokenizer", default="bpe", help="dew-prepare's --tokenizer (the preset's comment: bpe)")
    parser.add_argument("--vocab-size", type=int, default=1024, help="dew-prepare's --vocab-size for bpe (1024)")
    args, overrides = parser.parse_known_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep or tmp)
        for seed in args.seeds:
            tokenizer = ["--tokenizer", args.tokenizer]
            tokenizer += ["--vocab-size", str(args.vocab_size)] if args.tokenizer == "bpe" else []
            row = one_split(seed, args.held_out, tokenizer, overrides, root / f"split{seed}")
            rows.append(row)
            beats = row["tiny_lm_bits_per_byte"] < row["bzip2_9"]
            print(
                f"split {seed} (held out: {', '.join(row['held_out_modules'])}; {row['bytes']:,} bytes): "
                f"tiny_lm {row['tiny_lm_bits_per_byte']:.3f} bits/byte after {row['train_min']} min of training "
                f"({row['command_min']} min the command), bzip2 -9 {row['bzip2_9']:.3f}, xz -9 {row['xz_9']:.3f}"
                f"{'' if beats else '  (bzip2 wins)'}",
                flush=True,
            )
    record = {
        "bench": "tiny_lm_bzip2",
        "tokenizer": args.tokenizer,
        "vocab_size": args.vocab_size if args.tokenizer == "bpe" else None,
        "overrides": overrides,
        "cpus": os.cpu_count(),
        "splits": rows,
        "beats_bzip2": all(r["tiny_lm_bits_per_byte"] < r["bzip2_9"] for r in rows),
        "beats_xz": all(r["tiny_lm_bits_per_byte"] < r["xz_9"] for r in rows),
    }
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
