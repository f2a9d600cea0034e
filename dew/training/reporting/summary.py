"""What a run tells its user at its start and at its end.

At the start, before the step compiles: where the run lives (and, for a run given no name, the name
it got and how to resume it), the devices and the mesh, the parameter count and the optimizer
state's size, a warning when the compute dtype is emulated on this backend, and a line saying the
step is compiling; after the first step, how long that took (or that it loaded from the compilation
cache); the progress lines, from the first step on, are ``dew.training.reporting.progress``'s. At the
end: the final and the best evaluation with their steps, the wall time split into compile, train,
eval, samples and checkpoint, and the commands that come next. The trainer calls these at its chapter
boundaries; the wording lives here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import jax

from dew.contract.config import RunConfig
from dew.contract.rundir import human
from dew.models.flops import flops_per_example
from dew.sampling import write_grid
from dew.training.checkpointing.checkpoints import BEST_METRIC
from dew.training.process import compilation_cache_stats
from dew.training.run_directory import is_local

if TYPE_CHECKING:
    import optax
    from etils import epath
    from flax import nnx

    from dew.objectives.base import Objective
    from dew.training.reporting.tracker import Tracker
    from dew.training.step import TrainState

log = logging.getLogger("dew")

EMULATED = {("cpu", "bfloat16"): 1.5, ("cpu", "float16"): None}
"""(backend, compute dtype) pairs without native matmuls, with the slowdown against float32 measured
by bench/bf16_cpu.py (docs/performance.md); None where it was not measured."""


def _bytes(tree: Any) -> int:
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree) if hasattr(x, "dtype"))


def _count(n: int) -> str:
    return (
        f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else str(n)
    )


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


HELD_OUT_FIELDS = ("val_path", "val_split", "val_fraction", "eval_split", "eval_fraction")
"""The data options' fields that hold a split out for evaluation, as the start line names them."""


class RunReport:
    """The start and end messages of one run, and the clock that splits its wall time."""

    def __init__(
        self,
        run: RunConfig,
        name: str,
        path: str | os.PathLike[str],
        *,
        total_steps: int,
        samples: bool = True,
        every: tuple[int | None, int | None] | None = None,
        evaluates: bool = True,
        best: tuple[str, bool] = (BEST_METRIC, False),
    ) -> None:
        """``samples``: the objective draws samples (``dew.contract.objectives.can_sample``), so the
        end suggests ``dew-sample``. ``every``: the steps between evaluations and between
        checkpoints the run took (``Setup.eval_every``, ``ckpt_every``); unset, the fields as set.
        ``best``: the value that chooses the best checkpoint and whether higher is better
        (``dew.training.evaluate.best_criterion``), the one the end reports."""
        self.run, self.name, self.path, self.total_steps = run, name, os.fspath(path), total_steps
        self.samples = samples
        self.every = every or (run.trainer.eval_every, run.trainer.checkpoint_every)
        self.evaluates = evaluates
        self.best = best
        """Whether the data holds a held-out split to evaluate on: a run without one says so once, at the start."""
        self.t0 = time.perf_counter()
        self.t0_wall = time.time()
        self.spent = {"compile": 0.0, "eval": 0.0, "samples": 0.0, "checkpoint": 0.0}
        self._inner = 0.0
        """The time of the phases inside the one now open (samples inside an evaluation)."""
        self.began = self.t0_wall
        """When this start of the run was launched (``Setup.began``): where its start-up begins."""
        self.data_wait: Callable[[], float] = lambda: 0.0
        """The time the loop has waited for batches so far (the feed's ``waited_s``)."""
        self.evals: dict[int, dict[str, float]] = {}
        self._compile_start: float | None = None
        self._first = True
        self._cache_before: dict[str, int] = {}

    # ---------------------------------------------------------------------------------- start

    def unnamed(self) -> str | None:
        """What a run with no trainer.name needs to be resumed, or None for a named run."""
        if self.run.trainer.name:
            return None
        return (
            f"this run was given no trainer.name: it is called {self.name!r}; resume it with trainer.name={self.name}"
        )

    def start(
        self, *, mesh: jax.sharding.Mesh, params: nnx.State, opt_state: optax.OptState, resumed_from: int | None
    ) -> None:
        t = self.run.trainer
        devices = jax.devices()
        kinds = sorted({d.device_kind for d in devices})
        where = f"resuming at step {resumed_from}" if resumed_from is not None else "starting"
        log.info("run %s: %s, %d steps, in %s", self.name, where, self.total_steps, self.path)
        if (note := self.unnamed()) is not None:
            log.info(note)
        log.info(
            "devices: %d x %s (%s backend, %d process%s); mesh %s",
            len(devices),
            "/".join(kinds),
            jax.default_backend(),
            jax.process_count(),
            "" if jax.process_count() == 1 else "es",
            " ".join(f"{k}={v}" for k, v in mesh.shape.items()),
        )
        n = sum(math.prod(x.shape) for x in jax.tree.leaves(params) if hasattr(x, "shape"))
        log.info(
            "model: %s trainable parameters (%s); optimizer state %s (%s)",
            _count(n),
            human(_bytes(params)),
            human(_bytes(opt_state)),
            self.run.optim.optimizer,
        )
        dtype = self.run.model.dtype
        if (jax.default_backend(), dtype) in EMULATED:
            slow = EMULATED[(jax.default_backend(), dtype)]
            factor = (
                f"measured {slow:.1f}x slower per step than float32 on the README's digits run"
                if slow
                else "slower than float32"
            )
            log.warning(
                "model.dtype=%s is emulated on the %s backend (no native %s matmuls): %s "
                "(docs/performance.md). Set model.dtype=float32 for runs on this backend.",
                dtype,
                jax.default_backend(),
                dtype,
                factor,
            )
        if t.batch_size and self.total_steps:
            eval_every, ckpt_every = ("never (at the end only)" if n is None else n for n in self.every)
            evaluating = f"evaluating every {eval_every}" if self.evaluates else self.no_held_out()
            log.info(
                "batch %d; logging every %d steps, %s, checkpointing every %s",
                t.batch_size,
                t.log_every,
                evaluating,
                ckpt_every,
            )

    def no_held_out(self) -> str:
        """What a run whose data holds no held-out split evaluates (nothing), and the data fields that
        would hold some out."""
        data = self.run.data
        fields = {f.name for f in dataclasses.fields(data)} if dataclasses.is_dataclass(data) else set()
        named = [f"data.{f}" for f in HELD_OUT_FIELDS if f in fields]
        how = f"; {' or '.join(named)} holds some out" if named else ""
        return f"evaluating nothing (data={getattr(data, 'name', '?')} holds no held-out split{how})"

    def starting_step(self) -> bool:
        """True (once) before the first step this process runs, the call that compiles it; says so."""
        if not self._first:
            return False
        self._first = False
        self.compiling()
        return True

    def compiling(self) -> None:
        self._cache_before = compilation_cache_stats()
        self._compile_start = time.perf_counter()
        cache = (
            f" (compilation cache: {self.run.trainer.compilation_cache_dir})"
            if self.run.trainer.compilation_cache_dir
            else ""
        )
        log.info("compiling the train step%s ...", cache)

    def first_step(self, step: int, values: Mapping[str, float]) -> None:
        """Called once the first step's metrics are fetched: it has compiled and run. (Its metrics
        are the first progress line's: ``dew.training.reporting.progress``.)"""
        seconds = time.perf_counter() - (self._compile_start or self.t0)
        self.spent["compile"] += seconds
        hits = compilation_cache_stats()["hits"] - self._cache_before.get("hits", 0)
        if hits > 0:
            log.info("loaded the train step from the compilation cache and ran step %d in %s", step, _seconds(seconds))
        else:
            log.info("compiled the train step and ran step %d in %s", step, _seconds(seconds))

    # -------------------------------------------------------------------------------- the clock

    @contextlib.contextmanager
    def phase(self, kind: str) -> Iterator[None]:
        """Count the time spent inside as ``kind`` (eval, samples or checkpoint) instead of
        training; a phase inside another (the samples an evaluation draws) is its own, not the
        outer one's."""
        start, outer = time.perf_counter(), self._inner
        self._inner = 0.0
        try:
            yield
        finally:
            took = time.perf_counter() - start
            self.spent[kind] += took - self._inner
            self._inner = outer + took

    def ledger(self) -> dict[str, float]:
        """Where this start of the run has spent its wall time so far, in seconds (the journal's
        ``spent``, written with every ``stop`` and ``end`` event; ``dew-runs goodput`` adds them up):
        ``startup`` from the launch (``began``: the process's start for a dew command or job) to this
        report's (the interpreter, composing, the data, the model, the restore), then ``compile``
        (the first step), ``data`` (waiting for batches), ``eval``, ``samples`` (drawn at the
        evaluations and at the end, ``dew.training.trainer.Samples`` and dew-train's final ones),
        ``checkpoint`` (saves blocking the loop) and ``train``, the rest: the steps and the host's
        work between them."""
        since = time.perf_counter() - self.t0
        data = self.data_wait()
        timed = {"compile": self.spent["compile"], "data": data, "eval": self.spent["eval"]}
        timed["samples"] = self.spent["samples"]
        timed["checkpoint"] = self.spent["checkpoint"]
        startup = max(self.t0_wall - self.began, 0.0)
        return {
            "startup": round(startup, 3),
            **{k: round(v, 3) for k, v in timed.items()},
            "train": round(max(since - sum(timed.values()), 0.0), 3),
        }

    def evaluated(self, step: int, values: Mapping[str, float]) -> None:
        if values:
            self.evals[step] = dict(values)

    # ------------------------------------------------------------------------------------ end

    def end(self, step: int) -> None:
        wall = time.perf_counter() - self.t0
        train = max(wall - sum(self.spent.values()), 0.0)
        split = ", ".join(
            f"{k} {_seconds(v)}"
            for k, v in [
                ("compile", self.spent["compile"]),
                ("train", train),
                ("eval", self.spent["eval"]),
                *([("samples", self.spent["samples"])] if self.spent["samples"] else []),
                ("checkpoint", self.spent["checkpoint"]),
            ]
        )
        log.info("run %s finished at step %d in %s: %s", self.name, step, _seconds(wall), split)
        metric, higher = self.best  # the value that chose the best checkpoint, not always eval/loss
        scored = {s: v[metric] for s, v in self.evals.items() if math.isfinite(v.get(metric, math.nan))}
        if scored:
            last = max(scored)
            best = (max if higher else min)(scored, key=scored.__getitem__)
            log.info(
                "%s %.4g at step %d (final); best %.4g at step %d (the best checkpoint, when it was saved)",
                metric,
                scored[last],
                last,
                scored[best],
                best,
            )
        sweep = os.path.dirname(self.path) if "/" in self.name.strip("/") else self.path
        if self.samples:  # dew-sample takes the best checkpoint, or the newest where nothing was evaluated
            which = "the best checkpoint" if scored else "the newest checkpoint"
            log.info("next: dew-sample %s   (samples from %s)", self.path, which)
        log.info(
            "%s dew-runs plot %s   (loss curves; dew-runs %s lists the runs)",
            "     " if self.samples else "next:",
            sweep,
            sweep,
        )
        if (note := self.unnamed()) is not None:
            log.info(note)


def log_samples(tracker: Tracker, objective: Objective, state: TrainState, step: int, *, seed: int) -> None:
    """The objective's samples at an evaluation, as W&B media: the image grid (one row per class) or
    the text samples. Every process samples (the parameters may be laid out over all of them); the
    process that reports writes the grid beside the journal and logs it."""
    import numpy as np

    model = state.model(ema=state.ema is not None)
    key = jax.random.PRNGKey(seed + 3)  # the key dew-train's final samples are drawn with
    if hasattr(objective, "sample_grid"):
        images, labels = objective.sample_grid(model, key)
        if tracker.takes_media:
            folder = tracker.directory / "samples"
            folder.mkdir(parents=True, exist_ok=True)
            path = write_grid(os.fspath(folder / f"{step}.png"), images, rows=max(int(np.max(labels)) + 1, 1), scale=4)
            tracker.log_media(step, image=path)
    elif hasattr(objective, "sample_text"):
        _, texts = objective.sample_text(model, key)
        tracker.log_media(step, texts=texts)


def flops_per_example_of(run: RunConfig) -> float | None:
    """Training FLOPs of one example (``dew.models.flops``), None for an architecture it does not
    count."""
    try:
        return flops_per_example(run.model.architecture, run.model.fields())
    except (KeyError, ValueError, TypeError) as err:
        log.info("no FLOP count for %s (%s): perf/mfu is not logged", run.model.architecture, err)
        return None


def log_to_file(path: epath.Path) -> logging.Handler | None:
    """Append process 0's log to ``<run>/train.log`` for the run (the handler it added, which the run
    removes when it ends, or None); the other processes log to their standard streams only (under
    submitit, one log file per task in the sweep's .submitit/)."""
    if jax.process_index() != 0:
        return None
    if not is_local(os.fspath(path)):  # a logging.FileHandler streams to a local file only
        log.info("the run directory %s is not local: no train.log (the journal and stderr have the log)", path)
        return None
    filename = os.fspath(path / "train.log")
    root = logging.getLogger()
    if any(getattr(h, "baseFilename", None) == os.path.abspath(filename) for h in root.handlers):
        return None
    handler = logging.FileHandler(filename)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s"))
    root.addHandler(handler)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    return handler
