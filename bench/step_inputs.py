"""What the optimizer's numbers as inputs of the compiled step save (``Optimizer.inputs``): the
same sweep over the learning rate, the weight decay and the run's length, with those numbers as the
step's inputs (dew) and as constants of its program (before).

A side is one ``dew-train -m`` sweep under Hydra's basic launcher (its trials one after the other
in one process, as a search's trials run), with a fresh compilation cache: ``inputs`` is
``python -m dew.cli.train ...`` as a user runs it; ``constants`` is the same ``main`` with
``dew.training.optim.build.step_inputs`` answering nothing and AdamW not ``traceable``, so each
trial's rate, length and decay are constants of its program, as before, and nothing else
differs. The sides run interleaved, the order rotating each round. A side's cost is its process's
CPU time (user + system, from ``wait4``) and its trials' compilations, counted from their log lines
("compiled the train step" against "loaded the train step from the compilation cache").

    JAX_PLATFORMS=cpu python bench/step_inputs.py [--rounds 3] [--depth 1]

The last line printed is JSON: {"bench": "step_inputs", "cpu_ratio": ..., "compiled": {...}, ...}.
``cpu_ratio`` is the median over the rounds of the ``inputs`` side's CPU time over the ``constants``
side's in the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SWEEP = [
    "-m",
    "experiment=digits",
    "model.config.hidden_size=32",
    "model.config.num_heads=2",
    "trainer.batch_size=32",
    "trainer.eval_every=null",
    "trainer.checkpoint_every=null",
    "flow_matching.samples_per_class=1",
    "flow_matching.sample_steps=1",
    "optim.schedule.warmup_steps=1",
    "optim.learning_rate=0.001,0.003",
    "optim.weight_decay=0.01,0.05",
    "trainer.steps=4,6",
]
"""Eight trials: two rates, two weight decays, two lengths."""
CONSTANTS = (
    "import sys; sys.argv[0] = 'dew-train'; from dew.training.optim import adam, build; "
    "build.step_inputs = lambda *args: {}; adam.AdamW.traceable = False; "
    "from dew.cli import train; train.main()"  # the numbers baked in, as before
)


def run(side: str, work: Path, n: int, depth: int) -> tuple[float, dict[str, int]]:
    """CPU seconds of one sweep of ``side`` and its trials' compilations: {"compiled": k, "loaded": m}."""
    out = work / f"{side}{n}.log"
    args = [
        *SWEEP,
        f"model.config.depth={depth}",
        f"trainer.checkpoint_dir={work / f'ck{n}'}",
        f"trainer.compilation_cache_dir={work / f'xla{n}'}",  # fresh: the sweep's own compilations
        f"trainer.name={side}{n}",
    ]
    argv = (
        [sys.executable, "-m", "dew.cli.train", *args] if side == "inputs" else [sys.executable, "-c", CONSTANTS, *args]
    )
    with open(out, "w") as log:
        proc = subprocess.Popen(argv, cwd=work, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{side} sweep {n} failed ({out}):\n{out.read_text()[-3000:]}")
    text = out.read_text()
    steps = {
        "compiled": text.count("compiled the train step and ran step 1"),
        "loaded": text.count("loaded the train step from the compilation cache and ran step 1"),
    }
    return usage.ru_utime + usage.ru_stime, steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--depth", type=int, default=1, help="the DiT's blocks (a deeper step compiles longer)")
    args = parser.parse_args(argv)
    sides = ["inputs", "constants"]
    cpu: dict[str, list[float]] = {s: [] for s in sides}
    steps: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work, n = Path(tmp), 0
        for r in range(args.rounds):
            for side in sides if r % 2 == 0 else sides[::-1]:
                seconds, steps[side] = run(side, work, n, args.depth)
                n += 1
                cpu[side].append(seconds)
                print(f"round {r}: {side:9s} {seconds:6.2f} CPU-s  train steps {steps[side]}", flush=True)
    ratios = [i / c for i, c in zip(cpu["inputs"], cpu["constants"], strict=True)]
    record = {
        "bench": "step_inputs",
        "cpu_ratio": statistics.median(ratios),
        "cpu_ratios": [round(x, 3) for x in ratios],
        "cpu_s": {s: statistics.median(v) for s, v in cpu.items()},
        "train_steps": steps,
        "trials": 8,
        "depth": args.depth,
        "rounds": args.rounds,
    }
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
