"""Run tracking: a local journal always, and the trackers the run turns on (W&B, TensorBoard, MLflow,
CSV, a plugin's: dew.training.reporting.trackers, one module each). (What the console shows as the
run goes is ``dew.training.reporting.progress``.)

Library code talks to a ``Tracker``, which imports no tracker's library. The journal is JSON lines in a
tracking directory separate from the run directory: one record per logged step (its metrics) and
one per event (start, resume, eval, checkpoint, checkpoint_fallback, stop, end).

The file is only ever appended to, never truncated or rewritten: a resumed run (or a run started
again from scratch) adds a new segment after the old one, which begins with its ``resume`` (or
``start``) event. ``dew.contract.journal`` is its one reader: ``read_journal`` reads it as the run's
history (a segment replaces what earlier segments logged after the step it starts from: what a
killed process logged past its last checkpoint, which the resumed run logs again), so a resumed
run's journal of losses equals an uninterrupted run's; ``read_journal(path, raw=True)`` gives every
record as written.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from etils import epath

from dew.contract.config import TrainerConfig
from dew.contract.journal import read
from dew.contract.rundir import JOURNAL, JOURNAL_VERSION, TRACKING_DIR
from dew.launching import slurm
from dew.training.reporting import trackers
from dew.training.reporting.peak import measured_peak_flops
from dew.training.run_directory import absolute

log = logging.getLogger("dew")


def tracking_dir(trainer: TrainerConfig) -> epath.Path:
    """$DEW_TRACKING_DIR, else ``tracking/`` beside ``checkpoint_dir``."""
    if path := os.environ.get("DEW_TRACKING_DIR"):
        return epath.Path(path)
    return absolute(trainer.checkpoint_dir).parent / TRACKING_DIR


def _jsonable(value: Any) -> Any:
    """Strict JSON: a non-finite float becomes its name ("nan", "inf"), at any depth."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


class Journal:
    """Append-only JSON lines of the run's metrics and events."""

    def __init__(self, path: epath.Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        view = read(path) if path.exists() else None
        self.history = view.history() if view is not None else []
        """The run's history so far, as ``read_journal`` reads it."""
        # epath: a journal on any filesystem it reaches (gs://), not only a local one.
        self._file = path.open("a", encoding="utf-8")
        if view is not None and not view.terminated:
            self._file.write("\n")  # a line cut short by a killed process stays a line of its own

    def ended_at(self, step: int) -> bool:
        """Whether the run's history already ends (an ``end`` event) at ``step``."""
        return any(r.get("event") == "end" and r.get("step") == step for r in self.history)

    def write(self, record: Mapping[str, Any]) -> None:
        # allow_nan=False: every line is strict JSON (non-finite values are written as strings).
        self._file.write(json.dumps(_jsonable(dict(record)), allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class Tracker:
    """Where a run reports: the journal, and the trackers the run turns on (W&B, ``trainer.trackers``,
    a plugin's: dew.training.reporting.trackers), each told what the journal is told."""

    def __init__(
        self,
        trainer: TrainerConfig,
        name: str,
        *,
        record: Mapping[str, Any],
        summary: Mapping[str, object],
        total_steps: int,
        resume_step: int | None,
        wandb_id: str | None,
        is_main: bool,
        changed: Sequence[str] = (),
        mlflow_id: str | None = None,
        resume_ids: Mapping[str, str | None] | None = None,
        run_record: epath.Path | None = None,
        began: float | None = None,
    ) -> None:
        """``began``: when this start of the run was launched (``launched``); now where not given."""
        self.is_main = is_main
        self.began = time.time() if began is None else began
        self.total_steps = total_steps
        self.directory = tracking_dir(trainer) / name
        self.journal = Journal(self.directory / JOURNAL) if is_main else None
        # A run started again after it completed adds nothing: its history already ends there (a run
        # trained further, to a longer length, goes on from that end).
        self.complete = (
            self.journal is not None
            and resume_step is not None
            and resume_step >= total_steps
            and self.journal.ended_at(resume_step)
        )
        # Each tracker's own run a checkpoint kept (W&B's, MLflow's, a plugin's: resume_ids), by name.
        self._given = {"wandb": wandb_id, "mlflow": mlflow_id, **(resume_ids or {})}
        self.last_event: dict[str, Any] | None = None
        """The last ``stop`` or ``end`` event this segment wrote: how the run ended, for the trackers."""
        self.ledger: Callable[[], Mapping[str, float]] | None = None
        """Where this start's wall time went so far (``RunReport.ledger``): every ``stop`` and ``end``
        event carries it as ``spent``."""
        # The trackers the run turns on (process 0's): each told what the journal is told.
        self.sinks = (
            trackers.open_sinks(
                trainer,
                trackers.TrackedRun(
                    name=name,
                    directory=self.directory,
                    config={"run": dict(record), "summary": dict(summary), "total_steps": total_steps},
                    run_record=run_record,
                    history=self.journal.history,
                    resume_step=resume_step,
                    resume_id=None,
                ),
                self._given,
            )
            if self.journal is not None
            else []
        )
        # Under SLURM, when the job was queued and given its nodes: the goodput ledger's queue.
        queue = slurm.queue_times(os.environ) if self.journal is not None and not self.complete else {}
        # A resume that accepted changed settings says which (``path: old -> new``, rundir.py).
        self.event(
            "resume" if resume_step is not None else "start",
            step=resume_step or 0,
            journal=JOURNAL_VERSION,
            total_steps=total_steps,
            began=round(self.began, 3),  # when this start was launched: the goodput ledger's start of it
            **{k: round(v, 3) for k, v in queue.items()},
            **({"changed": list(changed)} if changed else {}),
        )

    @property
    def resume_ids(self) -> dict[str, str]:
        """Each tracker's own run, for a resume to continue it (kept in each checkpoint): the one
        it opened, else the one it was given (a tracker down for a while is continued once back)."""
        ids = {k: v for k, v in self._given.items() if v is not None}
        return ids | {g.name: g.resume_id for g in self.sinks if g.resume_id is not None}

    @property
    def wandb_id(self) -> str | None:
        """The W&B run this run logs to (kept in each checkpoint, so a resume continues it)."""
        return self.resume_ids.get("wandb")

    @property
    def mlflow_id(self) -> str | None:
        """The MLflow run this run logs to (kept in each checkpoint, so a resume continues it)."""
        return self.resume_ids.get("mlflow")

    def event(self, kind: str, *, step: int, **fields: Any) -> None:
        if self.journal is not None and not self.complete:
            if kind in ("stop", "end") and self.ledger is not None and "spent" not in fields:
                fields["spent"] = self.ledger()  # this start's wall time, by where it went
            record = {"event": kind, "step": step, "time": time.time(), **fields}
            self.journal.write(record)
            if kind in ("stop", "end"):
                self.last_event = record

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        if self.journal is None:  # not the process that reports
            return
        record = {"step": step, "time": time.time(), **values}
        self.journal.write(record)
        for sink in self.sinks:
            sink.call("metrics", record)

    @property
    def takes_media(self) -> bool:
        """Whether a tracker takes the samples of each evaluation (W&B, TensorBoard, MLflow, ...)."""
        return any(g.sink is not None and g.cls.takes_samples for g in self.sinks)

    def log_media(self, step: int, *, image: str | None = None, texts: list[str] | None = None) -> None:
        """Log samples at ``step`` to the trackers that take them: an image file, or text samples."""
        for sink in self.sinks:
            if not sink.cls.takes_samples:
                continue
            if image is not None:
                sink.call("image", step, image)
            if texts:
                sink.call("texts", step, texts)

    def publish_checkpoint(self, name: str, path: str, step: int) -> None:
        """Hand each tracker the checkpoint the run ends on (W&B publishes it as an artifact, by
        reference: no copy)."""
        for sink in self.sinks:
            sink.call("checkpoint", name, path, step)

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()
        ended = trackers.outcome(self.last_event)
        for sink in self.sinks:
            sink.call("close", ended)


# Peak dense matmul FLOP/s of one device, by the start of jax's ``device_kind``, from the vendors'
# data sheets (no sparsity): 16-bit (bfloat16/float16) tensor cores, and float32 as JAX computes it
# on these GPUs by default (TF32 tensor cores; plain FP32 on V100). Longer prefixes first.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "NVIDIA B200": {"16bit": 2250e12, "float32": 1100e12},
    "NVIDIA H200": {"16bit": 989e12, "float32": 494e12},
    "NVIDIA H100 PCIe": {"16bit": 756e12, "float32": 378e12},
    "NVIDIA H100": {"16bit": 989e12, "float32": 494e12},
    "NVIDIA GH200": {"16bit": 989e12, "float32": 494e12},
    "NVIDIA A100": {"16bit": 312e12, "float32": 156e12},
    "NVIDIA L40S": {"16bit": 362e12, "float32": 183e12},
    "NVIDIA L4": {"16bit": 121e12, "float32": 60e12},
    "NVIDIA A10": {"16bit": 125e12, "float32": 62.5e12},
    "Tesla V100": {"16bit": 125e12, "float32": 15.7e12},
}


def peak_flops(device_kind: str, dtype: str, devices: int) -> float | None:
    """Peak matmul FLOP/s of ``devices`` devices of ``device_kind`` computing in ``dtype``: the data
    sheet's for a kind the table knows; for any other kind of this process's devices (every CPU), the
    matmul ceiling measured once on this machine (``dew.training.reporting.peak``); None otherwise."""
    for prefix in sorted(PEAK_FLOPS, key=len, reverse=True):
        if device_kind.startswith(prefix):
            return PEAK_FLOPS[prefix]["float32" if dtype == "float32" else "16bit"] * devices
    import jax  # heavy: JAX stays out of the tracker's light users (dew-train's config steps, dew-runs)

    device = jax.devices()[0]
    if device.device_kind != device_kind:
        return None
    # A process's CPU devices (xla_force_host_platform_device_count) share its cores, and one
    # device's matmul already runs on all of them: the ceiling is per process there.
    return measured_peak_flops(dtype) * (jax.process_count() if device.platform == "cpu" else devices)


class Throughput:
    """Examples/s, tokens/s (token data), FLOP/s and MFU between two fetched log steps.

    Tokens are the targets that carry loss: ``tokens_per_example``, the dataset's
    ``tokens_per_record`` (``seq_len``; with packed documents or a chat's loss mask, the mean that
    count per window, padding and prompts left out: ``dew.data.packing.targets_per_record``).

    Fetching a step's metrics waits for that step, so the time between two fetches is the time the
    devices took for the records between them. The first window (compilation) is not reported, and
    ``restart`` after an evaluation or a checkpoint leaves their time out.
    """

    def __init__(
        self, *, flops_per_example: float | None, peak_flops: float | None, tokens_per_example: float | None = None
    ) -> None:
        self.flops_per_example, self.peak_flops = flops_per_example, peak_flops
        self.tokens_per_example = tokens_per_example
        self.mark: tuple[float, int] | None = None

    def restart(self, records: int) -> None:
        self.mark = (time.perf_counter(), records)

    def measure(self, records: int) -> dict[str, float]:
        now, out = time.perf_counter(), {}
        if self.mark is not None and now > self.mark[0] and records > self.mark[1]:
            rate = (records - self.mark[1]) / (now - self.mark[0])
            out["perf/examples_per_sec"] = rate
            if self.tokens_per_example:
                out["perf/tokens_per_sec"] = rate * self.tokens_per_example
            if self.flops_per_example:
                out["perf/flops_per_sec"] = rate * self.flops_per_example
                if self.peak_flops:
                    out["perf/mfu"] = rate * self.flops_per_example / self.peak_flops
        self.mark = (now, records)
        return out


def process_start() -> float:
    """When this process started (seconds since the epoch): where the goodput ledger starts a run's
    start-up, the interpreter's own start and its imports included.

    On Linux, from the kernel's own count (``/proc/self/stat``'s start time, in clock ticks since
    boot, against ``CLOCK_BOOTTIME``): to the clock tick. psutil's ``create_time`` adds that count to
    the boot time, which Linux gives in whole seconds, so it can be a second off; it is the answer
    elsewhere (macOS gives the start to the microsecond)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        import psutil  # a dependency of dew's (pyproject.toml)

        return float(psutil.Process().create_time())


def launched(set_up_at: float) -> float:
    """When this start of a run was launched: its process's start (``process_start``) in a process
    dew started for it (a dew command, a job a dew launcher submitted), where the interpreter's own
    start and its imports are the run's start-up; the moment its set-up began (``set_up_at``) in a
    process that was there before (a notebook, a test), whose earlier life is not the run's."""
    import sys

    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    module = getattr(spec, "name", "") or ""
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    ours = module.startswith(("dew.", "submitit.")) or script.startswith("dew-")
    return process_start() if ours else set_up_at
