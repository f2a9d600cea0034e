"""Whether a step waits for its data: the trainer's step time on a dataset whose batches take
``--cost`` seconds to produce, with the batches read ahead (``trainer.prefetch``, its default) and
without (``trainer.prefetch=0``), against the same steps on a dataset that costs nothing.

The model is the digits experiment's DiT at a width and depth (``--hidden``, ``--depth``, ``--batch``)
that make a step take about 0.6 s on a quiet 2-core CPU: long enough that the loop runs with no host
lead (dew/training/pace.py), so without prefetch every batch's cost lands between two steps. The
data is ``bench/_loops.py``'s ``Synthetic`` (one batch in host memory, handed out every step), and
the costly dataset is the same batch handed out after a ``time.sleep`` of ``--cost``: a source that
waits (a remote file system, a decoder in another process) without taking the cores the step
computes on. Three sides, in one process, interleaved round by round with the order rotating:
``free`` (no cost, prefetch on), ``prefetch`` (the cost, prefetch on), ``sync`` (the cost, prefetch
0). Each side is one ``RunConfig.train`` of ``--warmup + --steps + 1`` steps logging every step, timed
from outside the trainer: a step's time is the gap between its metrics and the previous step's
reaching the tracker (each fetch waits for its step), over the steps after the warm-up, so set-up,
compilation and the final save are left out; and the loop's wait for each step's batch is the time
spent in ``Feed.next``.

    JAX_PLATFORMS=cpu python bench/prefetch.py [--cost 0.05 --steps 20 --rounds 3 --hidden 320 --depth 6 --batch 128]

The last line printed is JSON: {"bench": "prefetch", "prefetch_over_free": ..., "sync_over_free": ...,
...}. ``prefetch_over_free`` is the median over the rounds of the costly side's mean step with
prefetch over the free side's in the same round (the target: at most 1.03), ``sync_over_free`` the
same without prefetch; ``fastest_*_over_free`` compare each side's fastest step over every round,
the one the other jobs of a shared machine slowed least (they only ever add time); ``wait_ms`` is
each side's median wait for a batch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__:  # imported as bench.prefetch
    from bench._loops import Synthetic, metrics_times
    from bench.trainer_overhead import compose
else:  # run as a script: bench/ is first on sys.path
    from _loops import Synthetic, metrics_times
    from trainer_overhead import compose


class Costly(Synthetic):
    """``Synthetic``, each batch handed out ``cost`` seconds after it is asked for."""

    def __init__(self, arch: str, fields: dict[str, Any], batch_size: int, cost: float) -> None:
        super().__init__(arch, fields, batch_size)
        self.cost = cost

    def next(self, batch_size: int | None = None):
        time.sleep(self.cost)
        return self.batch


def side(recipe, data: Synthetic, prefetch: int, steps: int, warmup: int, work: Path, name: str) -> Side:
    """One run of ``warmup + steps + 1`` steps logging every step: the seconds between consecutive
    steps' metrics reaching the tracker (each fetch waits for its step, and comes one step late), and
    the seconds the loop waited for each step's batch (in ``Feed.next``), both over the ``steps``
    after ``warmup``; the last step is left out (its metrics come at the end, right after the ones
    before). Timed from here."""
    from dew.build import build_run
    from dew.training.prefetch import Feed

    run = dataclasses.replace(
        recipe,
        trainer=dataclasses.replace(
            recipe.trainer, steps=warmup + steps + 1, log_every=1, prefetch=prefetch, checkpoint_dir=str(work / "ck")
        ),
    )
    run, objective, _ = build_run(run)
    waits: list[float] = []
    feed = Feed.next

    def timed_next(self: Feed):
        start = time.perf_counter()
        try:
            return feed(self)
        finally:
            waits.append(time.perf_counter() - start)

    Feed.next = timed_next
    try:
        with metrics_times() as seen:
            run.train(objective, data, name=name)
    finally:
        Feed.next = feed
    gaps = [seen[s][0] - seen[s - 1][0] for s in range(warmup + 1, warmup + steps + 1)]
    return Side(gaps, waits[warmup : warmup + steps])  # call k of Feed.next feeds step k + 1


@dataclasses.dataclass
class Side:
    steps_s: list[float]
    """Seconds of each timed step (between its metrics and the previous step's)."""
    waits_s: list[float]
    """Seconds the loop waited for each timed step's batch."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cost", type=float, default=0.05, help="seconds to produce a batch, costly side")
    parser.add_argument("--steps", type=int, default=20, help="steps timed per side per round")
    parser.add_argument("--warmup", type=int, default=3, help="steps run before the timed ones, per side")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=320, help="model.config.hidden_size")
    parser.add_argument("--depth", type=int, default=6, help="model.config.depth")
    parser.add_argument("--batch", type=int, default=128, help="trainer.batch_size")
    args = parser.parse_args()
    logging.getLogger("absl").setLevel(logging.WARNING)
    from dew.build import build_run

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        recipe = compose(
            "experiment=digits",
            f"trainer.batch_size={args.batch}",
            f"model.config.depth={args.depth}",
            f"model.config.hidden_size={args.hidden}",
            "trainer.eval_every=null",
            "trainer.checkpoint_every=null",
            "flow_matching.ema_decay=0",
            f"trainer.compilation_cache_dir={work / 'xla'}",
            "optim.schedule.warmup_steps=1",
        )
        recipe = build_run(recipe)[0]  # the model fields the digits imply (image size, classes)
        arch, fields = recipe.model.architecture, dict(recipe.model.fields())
        default = type(recipe.trainer)().prefetch
        sides = {
            "free": (Synthetic(arch, fields, args.batch), default),
            "prefetch": (Costly(arch, fields, args.batch, args.cost), default),
            "sync": (Costly(arch, fields, args.batch, args.cost), 0),
        }
        runs: dict[str, list[Side]] = {k: [] for k in sides}
        order = list(sides)
        for r in range(args.rounds):
            for name in order[r % 3 :] + order[: r % 3]:  # each side first in one round of three
                data, prefetch = sides[name]
                runs[name].append(side(recipe, data, prefetch, args.steps, args.warmup, work, f"{name}-{r}"))
            mean = {k: statistics.mean(v[-1].steps_s) for k, v in runs.items()}
            wait = {k: statistics.mean(v[-1].waits_s) * 1e3 for k, v in runs.items()}
            print(
                f"round {r}: mean step {mean['free']:.3f} s free, {mean['prefetch']:.3f} s with a "
                f"{args.cost * 1e3:g} ms batch prefetched, {mean['sync']:.3f} s read at the step; the loop "
                f"waited for data {wait['free']:.2f}, {wait['prefetch']:.2f}, {wait['sync']:.2f} ms a step",
                flush=True,
            )
    # Per round, the ratio of the sides' mean steps; over every round, the ratio of the sides' fastest
    # step, the one least slowed by the other jobs of a shared machine (they only ever add time).
    per_round = {k: [statistics.mean(r.steps_s) for r in v] for k, v in runs.items()}
    fastest = {k: min(min(r.steps_s) for r in v) for k, v in runs.items()}
    ratios = {k: [a / b for a, b in zip(per_round[k], per_round["free"], strict=True)] for k in ("prefetch", "sync")}
    print(
        json.dumps(
            {
                "bench": "prefetch",
                "prefetch_over_free": round(statistics.median(ratios["prefetch"]), 3),
                "prefetch_over_frees": [round(x, 3) for x in ratios["prefetch"]],
                "sync_over_free": round(statistics.median(ratios["sync"]), 3),
                "sync_over_frees": [round(x, 3) for x in ratios["sync"]],
                "fastest_prefetch_over_free": round(fastest["prefetch"] / fastest["free"], 3),
                "fastest_sync_over_free": round(fastest["sync"] / fastest["free"], 3),
                "fastest_step_s": {k: round(v, 3) for k, v in fastest.items()},
                "mean_step_s": {k: [round(x, 3) for x in v] for k, v in per_round.items()},
                "wait_ms": {
                    k: round(statistics.median(w for r in v for w in r.waits_s) * 1e3, 2) for k, v in runs.items()
                },
                "cost_s": args.cost,
                "prefetch": default,
                "steps": args.steps,
                "rounds": args.rounds,
                "hidden": args.hidden,
                "depth": args.depth,
                "batch": args.batch,
            }
        )
    )


if __name__ == "__main__":
    main()
