"""What the downstream tasks cost a run (``trainer.evals``): a next-token run scored on a
multiple-choice task every ``--every`` steps, the share of its wall time the scoring takes.

A ``transformer`` (width ``--width``, ``--depth`` layers, ``--seq-len`` byte tokens of random words,
batch ``--batch``) trains ``--steps`` steps with ``trainer.evals.every=--every``; the task holds
``--examples`` examples of 4 choices each (contexts of 40-400 characters, so the rows fill several
length buckets), scored ``trainer.evals.batch_size=--rows`` rows at a time. The scoring is timed
where the loop calls it (``TaskEvaluator.__call__``: the bench wraps it with a clock, compilation of
each bucket's program at the first call included), the run from its start event's launch to its end
event. No checkpoints, the held-out loss at the last step only, no compilation cache. The last line
is the JSON record.

    JAX_PLATFORMS=cpu python bench/task_evals.py                   # 3,000 steps, scored every 1,000
    JAX_PLATFORMS=cpu python bench/task_evals.py --steps 300 --every 100 --examples 50   # a quick look

(tests/bench/test_task_evals_bench.py runs it at a few steps of a width-16 model, from the suite's
compilation cache: ``--cache``.)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

WORDS = [
    *("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while"),
    *("naive", "cafes", "serve", "creme", "brulee", "to", "every", "guest"),
]


def task_file(path: Path, examples: int, rng: np.random.Generator) -> None:
    with open(path, "w") as fh:
        for _ in range(examples):
            context = " ".join(rng.choice(WORDS, int(rng.integers(8, 80))))
            choices = [" ".join(rng.choice(WORDS, int(rng.integers(2, 8)))) for _ in range(4)]
            fh.write(json.dumps({"context": context, "choices": choices, "gold": int(rng.integers(4))}) + "\n")


def _run(args: argparse.Namespace) -> list[dict]:
    """The run as ``args`` say, in a temporary directory: its journal's records."""
    from dew.build import build_run
    from dew.contract.journal import read_journal
    from dew.data.prepare import prepare
    from tests.training.mesh_runs import compose

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rng = np.random.default_rng(0)
        for name, n in (("train", args.train_words), ("val", 2_000)):
            (root / f"{name}.txt").write_text(" ".join(rng.choice(WORDS, n)) + "\n")
        prepare([str(root / "train.txt")], str(root / "bytes"), val=[str(root / "val.txt")])
        task_file(root / "task.jsonl", args.examples, rng)
        recipe, objective, dataset = build_run(
            compose(
                "data=token_windows",
                f"data.path={root / 'bytes' / 'train.bin'}",
                f"data.val_path={root / 'bytes' / 'val.bin'}",
                f"data.seq_len={args.seq_len}",
                f"model.config={{hidden_size: {args.width}, depth: {args.depth}, num_heads: 4}}",
                "model.dtype=float32",
                f"trainer.batch_size={args.batch}",
                f"trainer.steps={args.steps}",
                "trainer.eval_every=null",
                "trainer.checkpoint_every=null",
                "trainer.log_every=100",
                f"trainer.compilation_cache_dir={args.cache or 'null'}",
                f"trainer.checkpoint_dir={root / 'ck'}",
                f"trainer.evals={{tasks: [{{name: mc, path: {root / 'task.jsonl'}}}], every: {args.every}, "
                f"batch_size: {args.rows}}}",
            )
        )
        recipe.train(objective, dataset, name="bench")
        return read_journal(root / "tracking" / "bench" / "journal.jsonl")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--every", type=int, default=1000, help="trainer.evals.every")
    p.add_argument("--examples", type=int, default=250, help="examples of the task (4 choices each)")
    p.add_argument("--rows", type=int, default=64, help="trainer.evals.batch_size")
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--train-words", type=int, default=200_000, help="random words of training text")
    p.add_argument("--cache", default=None, help="trainer.compilation_cache_dir (unset: none; the figure compiles all)")
    args = p.parse_args(argv)

    from dew.training.task_evals import TaskEvaluator

    spent: list[float] = []
    score = TaskEvaluator.__call__

    def timed(self: TaskEvaluator, params: object) -> dict[str, float]:
        start = time.perf_counter()
        values = score(self, params)  # fetched: the values are numbers
        spent.append(time.perf_counter() - start)
        return values

    TaskEvaluator.__call__ = timed  # type: ignore[method-assign]
    try:  # the clock comes off again: a test calls main in its own process
        records = _run(args)
    finally:
        TaskEvaluator.__call__ = score  # type: ignore[method-assign]
    rows = args.examples * 4
    (start,) = [r for r in records if r.get("event") == "start"]
    (end,) = [r for r in records if r.get("event") == "end"]
    wall = end["time"] - start["began"]
    tasks_s = sum(spent)
    record = {
        "steps": args.steps,
        "every": args.every,
        "scorings": len(spent),
        "rows": rows,
        "model": f"width {args.width}, depth {args.depth}, seq_len {args.seq_len}, batch {args.batch}",
        "wall_s": round(wall, 2),
        "tasks_s": round(tasks_s, 2),
        "first_scoring_s": round(spent[0], 2),
        "later_scoring_s": round(float(np.mean(spent[1:])), 3) if len(spent) > 1 else None,
        "share_of_wall": round(tasks_s / wall, 4),
        "spent": end.get("spent"),
    }
    print(
        f"{len(spent)} scorings of {rows} rows in a {args.steps}-step run: {tasks_s:.2f} s of {wall:.1f} s "
        f"({100 * tasks_s / wall:.2f}%; the first, compiling, {spent[0]:.2f} s)"
    )
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
