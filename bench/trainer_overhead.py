"""RunConfig.train against a minimal hand-written jax.jit + optax loop, and the asynchronous
checkpoint's blocking time against the save's own duration.

Both loops train the same model (the digits experiment's DiT), on the same data (the digits
iterator), with the same optimizer (``build_optimizer`` of the run's OptimConfig), in one process,
interleaved round by round. The hand-written side is a jitted, donated value_and_grad + optax step
fed from the dataset's iterator, blocked on once at the end; its per-step key is folded from a step
counter inside ``jit``, as the trainer's is, so neither side pays a dispatch the other does not. The
trainer side is ``RunConfig.train`` with no evaluation and no checkpoints but the final one, logging
at the end of the warm-up and at the last step; its loop time is the wall time between the tracker
receiving those two steps' metrics (a fetch waits for its step), taken by the benchmark, so set-up,
compilation and the final save are left out of both sides. The EMA is off
(``flow_matching.ema_decay=0``): it is the objective's work, not the loop's.

    JAX_PLATFORMS=cpu python bench/trainer_overhead.py [--steps 300 --rounds 5 --batch 64 --hidden 64 --depth 2]

The last line printed is JSON: {"bench": "trainer_overhead", "ratio": ..., ...}.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import jax
from flax import nnx

if __package__:  # imported as bench.trainer_overhead
    from bench._loops import bare_loop, trainer_loop
else:  # run as a script: bench/ is first on sys.path
    from _loops import bare_loop, trainer_loop


def compose(*overrides: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from dew.commandline.configs import conf_dir, register_configs
    from dew.recipe import Recipe

    GlobalHydra.instance().clear()
    register_configs()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=list(overrides))
    return Recipe.from_dict(OmegaConf.to_container(cfg, resolve=True))


def hand_loop(recipe, steps: int, warmup: int) -> tuple[float, float]:
    """Wall and process-CPU seconds for ``steps`` steps of the hand-written loop (bench/_loops.py)
    after ``warmup`` (compilation) steps, fed by the dataset's iterator."""
    from dew.build import build_run

    recipe, objective, dataset = build_run(recipe)
    return bare_loop(objective, recipe.optim, dataset.iterator(), steps, warmup)


def trainer_side(recipe, steps: int, warmup: int, work: Path, name: str) -> tuple[float, float]:
    """Wall and process-CPU seconds the trainer's loop took for steps ``warmup``..``warmup + steps``
    (bench/_loops.py times it from outside the trainer)."""
    import dataclasses

    from dew.build import build_run

    run = dataclasses.replace(
        recipe,
        trainer=dataclasses.replace(
            recipe.trainer, steps=warmup + steps, log_every=warmup, checkpoint_dir=str(work / "ck")
        ),
    )
    run, objective, dataset = build_run(run)
    return trainer_loop(run, objective, dataset, steps, warmup, name)


def checkpoint_blocking(work: Path, recipe, saves: int) -> tuple[list[float], list[float], int]:
    """Per save: the seconds ``save`` blocks the caller, and the seconds until it is on disk."""
    from dew.build import build_run
    from dew.training.checkpointing.checkpoints import Checkpoints
    from dew.training.optim.build import build_optimizer

    _, objective, _ = build_run(recipe)
    params = nnx.state(objective.build(nnx.Rngs(params=0)), nnx.Param)
    state = {"params": params, "opt": build_optimizer(recipe.optim, params, total_steps=10).tx.init(params)}
    size = sum(x.nbytes for x in jax.tree.leaves(state))
    ckpts = Checkpoints(work / "ckpt-bench", keep=2)
    blocking, total = [], []
    for i in range(saves):
        start = time.perf_counter()
        ckpts.save(i + 1, state, {"step": i + 1}, metrics=None)
        blocking.append(time.perf_counter() - start)
        ckpts.wait()
        total.append(time.perf_counter() - start)
    ckpts.close()
    return blocking, total, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="steps timed per side per round")
    parser.add_argument("--warmup", type=int, default=10, help="steps run before the timed ones, per side")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=64, help="model.config.hidden_size")
    parser.add_argument("--depth", type=int, default=2, help="model.config.depth")
    args = parser.parse_args()
    logging.getLogger("absl").setLevel(logging.WARNING)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        recipe = compose(
            "experiment=digits",
            f"trainer.batch_size={args.batch}",
            f"model.config.depth={args.depth}",
            f"model.config.hidden_size={args.hidden}",
            "trainer.eval_every=null",
            "trainer.checkpoint_every=null",
            "trainer.log_every=100",
            "flow_matching.ema_decay=0",
            f"trainer.compilation_cache_dir={work / 'xla'}",
            "optim.schedule.warmup_steps=1",
        )
        hand, ours, hand_cpu, ours_cpu = [], [], [], []
        for r in range(args.rounds):
            sides = ["hand", "trainer"] if r % 2 == 0 else ["trainer", "hand"]
            for side in sides:
                if side == "hand":
                    wall, cpu = hand_loop(recipe, args.steps, args.warmup)
                    hand.append(args.steps * args.batch / wall)
                    hand_cpu.append(cpu)
                else:
                    wall, cpu = trainer_side(recipe, args.steps, args.warmup, work, f"r{r}")
                    ours.append(args.steps * args.batch / wall)
                    ours_cpu.append(cpu)
            print(
                f"round {r}: hand {hand[-1]:.0f} ex/s, trainer {ours[-1]:.0f} ex/s, "
                f"ratio {ours[-1] / hand[-1]:.3f}; CPU seconds hand/trainer "
                f"{hand_cpu[-1] / ours_cpu[-1]:.3f}",
                flush=True,
            )
        ratios = [o / h for o, h in zip(ours, hand, strict=True)]
        # The same ratio in process CPU time: what each loop cost, whatever share of the cores it got.
        cpu_ratios = [h / o for h, o in zip(hand_cpu, ours_cpu, strict=True)]
        blocking, total, size = checkpoint_blocking(work, recipe, args.saves)
    step_ms = 1000 * args.batch / statistics.median(hand)
    print(
        f"checkpoint of {size / 2**20:.1f} MiB: save blocks {1000 * statistics.median(blocking):.1f} ms, "
        f"lands in {1000 * statistics.median(total):.1f} ms (median of {args.saves})"
    )
    print(
        json.dumps(
            {
                "bench": "trainer_overhead",
                "ratio": round(statistics.median(ratios), 4),
                "ratios": [round(x, 4) for x in ratios],
                "cpu_ratio": round(statistics.median(cpu_ratios), 4),
                "cpu_ratios": [round(x, 4) for x in cpu_ratios],
                "hand_examples_per_sec": round(statistics.median(hand)),
                "trainer_examples_per_sec": round(statistics.median(ours)),
                "step_ms": round(step_ms, 1),
                "batch": args.batch,
                "steps": args.steps,
                "device": jax.devices()[0].device_kind,
                "checkpoint_mib": round(size / 2**20, 2),
                "checkpoint_blocking_ms": round(1000 * statistics.median(blocking), 1),
                "checkpoint_total_ms": round(1000 * statistics.median(total), 1),
            }
        )
    )


if __name__ == "__main__":
    main()
