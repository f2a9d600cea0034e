"""The loop's hook point: what happens around the steps, each part at its own cadence.

A hook is a ``Hook``: ``every`` steps (and at the run's last step) the loop calls its ``on_step``
with where the run is (``At``: the step, the records consumed, the state, the step's metrics). The
run's own parts are hooks (the profiler, the metric report, the evaluation, the checkpoint, the
samples); a run adds its own from config (``trainer.hooks``: a registered name, a cadence, options)
or a plugin's through the ``hooks`` registry. The loop never changes for a new per-step behaviour.

Cadence and cost: a hook runs only at its steps (nothing happens on the others but one modulo per
hook), so the step's hot path gains no host work. A ``late`` hook gets the step's metrics as
numbers one step late: the loop holds them on the devices and fetches them after the next step is
dispatched, once for every hook that asked (``trainer.log_every``'s report is one), so a hook never
makes the host wait for the step it just queued. Once steps are long, the loop waits for each step
it dispatches anyway (``dew.training.pace``): a late hook then gets the step's metrics at its end.
A hook with a ``phase`` (an evaluation, a save) takes time that is not step time: before it the
loop reports the metrics it holds and checks the state is finite, and the throughput clock restarts
after it. ``on_eval`` hooks run at each evaluation, with its values.

A hook may end the run early: ``Started.request_stop`` asks the loop to stop after the step in
flight, as a finished run ends (``dew.training.preemption.StopRequest``; early stopping is one such
hook). A hook with a ``state_key`` keeps its ``state()`` in every checkpoint and gets it back in
``Started.saved`` when the run resumes from one, so a resumed run goes on exactly as an
uninterrupted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, ClassVar

from dew.contract.registry import Registry

if TYPE_CHECKING:
    from dew.contract.config import HookSpec, RunConfig
    from dew.objectives.base import Objective
    from dew.training.preemption import StopRequest
    from dew.training.reporting.tracker import Tracker
    from dew.training.state import TrainState

NONFINITE = "_nonfinite_step"
"""The step's metric (not logged) that carries the first non-finite step, -1 while there is none;
here, not in step.py, so that registering a hook loads no JAX (plugins register while a config is
composed)."""


@dataclasses.dataclass
class Started:
    """What every hook is told once, before this process's first step."""

    run: RunConfig
    objective: Objective
    tracker: Tracker
    """Where the run reports: ``tracker.metrics(step, values)`` writes the journal (and W&B)."""
    step: int
    """The step the loop starts from: 0, or the step it resumed from."""
    total_steps: int
    request_stop: Callable[[StopRequest], None]
    """Ask the run to end after the step in flight, as a finished run ends (every process must ask
    at the same step: ``dew.training.preemption``)."""
    saved: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The hooks' states in the checkpoint the run resumed from, by ``Hook.state_key`` (empty for a
    new run)."""


@dataclasses.dataclass
class At:
    """Where the run is after a step: what ``on_step`` reads."""

    step: int
    """Steps completed."""
    records: int
    """Records consumed by them."""
    state: TrainState
    """The state after the step (on the devices; reading it waits for the step)."""
    metrics: Mapping[str, Any]
    """The step's metrics: device arrays, or numbers for a ``late`` hook (the objective's derived
    metrics included)."""
    last: bool
    """The run's last step."""
    evaluation: dict[str, float] | None = None
    """The values of the evaluation run at this step, for the hooks after it; None if none ran."""


class Hook:
    """One behaviour around the steps. Subclass it and override what the hook does; a hook built
    from config (``trainer.hooks``) is constructed with ``every`` and its options."""

    late: ClassVar[bool] = False
    """Get ``on_step`` one step late, with the step's metrics fetched as numbers."""
    phase: ClassVar[str | None] = None
    """A phase of the run's report (``eval``, ``checkpoint``): time that is not step time."""
    state_key: ClassVar[str | None] = None
    """Where each checkpoint keeps this hook's ``state()`` (handed back in ``Started.saved`` on a
    resume); None keeps nothing."""
    after_checkpoint: ClassVar[bool] = False
    """Run after the step's checkpoint instead of before it: for a hook that only reads the state
    (the final samples), so that a failure in it cannot cost the step's save."""

    def __init__(self, every: int | None = 1) -> None:
        self.every = every
        """Steps between calls; None: at the last step only (every hook also runs there)."""

    def due(self, step: int, last: bool) -> bool:
        return last or (self.every is not None and step % self.every == 0)

    def start(self, started: Started) -> None:
        """Before this process's first step."""

    def before(self, step: int) -> None:
        """Before step ``step`` + 1 is dispatched (``step`` steps done); called every step, and only
        for a hook that overrides it."""

    def on_step(self, at: At) -> None:
        """At the hook's steps."""

    def on_eval(self, step: int, values: Mapping[str, float], state: TrainState) -> None:
        """After each evaluation, inside its phase."""

    def close(self) -> None:
        """When the run ends, however it ends."""

    def state(self) -> Mapping[str, Any]:
        """What a checkpoint keeps of this hook (JSON values), read at each save; only for a hook
        with a ``state_key``."""
        return {}


hooks: Registry[type[Hook]] = Registry("hook")
"""Hooks a run names in ``trainer.hooks``: ``@hooks.register("my_hook")`` on a ``Hook`` subclass
(a plugin's through the ``dew.plugins`` entry point, docs/extending.md)."""


def from_config(specs: Sequence[HookSpec]) -> list[Hook]:
    """The hooks ``trainer.hooks`` names, built with their cadence and options; an unknown name or
    an option the hook does not take raises naming it."""
    built = []
    for i, spec in enumerate(specs):
        try:
            cls = hooks[spec.name]
        except ValueError as err:
            raise ValueError(f"trainer.hooks[{i}]: {err}") from None
        try:
            built.append(cls(every=spec.every, **spec.options))
        except TypeError as err:
            raise ValueError(
                f"trainer.hooks[{i}]: hook {spec.name!r} does not take options {dict(spec.options)!r}: {err}"
            ) from None
    return built


class Hooks:
    """The loop's hooks in order, called at their cadence; late hooks get metrics one step late."""

    def __init__(
        self,
        hooks: Sequence[Hook],
        *,
        derive: Callable[[Mapping[str, float]], dict[str, float]],
        check_finite: Callable[[TrainState], None],
        restart: Callable[[int], None],
        phase: Callable[[str], AbstractContextManager[object]],
    ) -> None:
        self.hooks = list(hooks)
        keys = [h.state_key for h in self.hooks if h.state_key is not None]
        if len(set(keys)) != len(keys):
            raise ValueError(f"hooks: state keys {keys} repeat; each hook's state needs its own key")
        self._before = [h for h in self.hooks if type(h).before is not Hook.before]
        self.derive = derive
        """The objective's derived metrics from the fetched ones."""
        self.check_finite = check_finite
        """Raises if the state went non-finite (``Saver.check_finite``)."""
        self.restart = restart
        """Restart the throughput clock at a count of records (``Throughput.restart``)."""
        self.phase = phase
        """A timed phase of the run's report (``RunReport.phase``)."""
        self.pending: tuple[At, list[Hook]] | None = None
        """A step whose metrics late hooks wait for, still on the devices."""

    def start(self, started: Started) -> None:
        for hook in self.hooks:
            hook.start(started)

    def before(self, step: int) -> None:
        for hook in self._before:
            hook.before(step)

    def after(self, at: At, *, ready: bool = False) -> None:
        """After step ``at.step``: the held metrics reported, then each hook due at this step.
        ``ready``: the step has ended, or the loop waits for it next anyway (long steps: ``Pace``),
        so its late hooks get its metrics now instead of one step late."""
        self.flush(at.state)
        due = [h for h in self.hooks if h.due(at.step, at.last)]
        if late := [h for h in due if h.late]:
            self.pending = (at, late)
            if ready:
                self.flush(at.state)
        paused = False
        for hook in due:
            if hook.late:
                continue
            if hook.phase is None:
                hook.on_step(at)
                continue
            if not paused:  # a checkpoint holds only a state that never went non-finite
                self.flush(at.state)
                self.check_finite(at.state)
                paused = True
            with self.phase(hook.phase):
                hook.on_step(at)
        if paused:
            self.restart(at.records)  # evaluation and the save's copy are not step time

    def states(self) -> dict[str, dict[str, Any]]:
        """Every stateful hook's state, by its key: what a checkpoint keeps."""
        return {h.state_key: dict(h.state()) for h in self.hooks if h.state_key is not None}

    def evaluated(self, step: int, values: Mapping[str, float], state: TrainState) -> None:
        for hook in self.hooks:
            hook.on_eval(step, values, state)

    def flush(self, state: TrainState) -> None:
        """Fetch the held step's metrics, if any (waiting for that step), and call its late hooks;
        a step that went non-finite stops the run (``check_finite`` raises)."""
        if self.pending is None:
            return
        import jax  # heavy: JAX stays out of registering a hook (plugins load while a config is composed)

        at, late = self.pending
        self.pending = None
        fetched = {k: float(v) for k, v in jax.device_get(dict(at.metrics)).items()}
        if fetched.pop(NONFINITE) >= 0:
            self.check_finite(state)
        fetched.update(self.derive(fetched))
        done = dataclasses.replace(at, metrics=fetched)
        for hook in late:
            hook.on_step(done)

    @contextlib.contextmanager
    def held(self) -> Iterator[Hooks]:
        """The hooks until the run ends: each closed then, whatever closing another raised."""
        with contextlib.ExitStack() as closing:
            for hook in reversed(self.hooks):
                closing.callback(hook.close)
            yield self
