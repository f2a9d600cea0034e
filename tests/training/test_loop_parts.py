"""The trainer loop's parts, each alone (no trainer run): evaluation's sums and means, metrics
fetched one step late, what a save records and when a stop saves, the profiling window, and the
set-up's lock taken once per run with nothing remembered between runs."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

from dew.training import evaluate, trainer
from dew.training import run_directory as rundir
from dew.training.checkpointing.saving import NonFiniteError, Saver, plain
from dew.training.evaluate import Evaluator
from dew.training.hooks import At, Hooks
from dew.training.preemption import Preempted
from dew.training.reporting.late_metrics import Reporter
from dew.training.reporting.profiler import Profiler
from dew.training.step import NONFINITE


def _batch_sums(total: float, count: float, own: float, metric: tuple[float, float]) -> Any:
    return jnp.float32(total), jnp.float32(count), {"mse": jnp.float32(own)}, {"acc": tuple(map(jnp.float32, metric))}


def test_evaluation_divides_the_summed_batches_once():
    batches = {0: _batch_sums(6.0, 2.0, 4.0, (1.0, 2.0)), 1: _batch_sums(3.0, 4.0, 2.0, (3.0, 2.0))}
    keys = []

    def eval_step(params: Any, batch: Any, key: Any) -> Any:
        keys.append(key)
        return batches[int(batch)]

    evaluator = Evaluator(
        eval_step,
        lambda: [np.int32(0), np.int32(1)],
        lambda b: b,
        seed=5,
        derive=lambda v: {"eval/ppl": math.exp(v["eval/loss"])},
    )
    values = evaluator(params=None)
    assert values == pytest.approx(
        {"eval/loss": 9 / 6, "eval/mse": 6 / 6, "eval/acc": 4 / 4, "eval/ppl": math.exp(1.5)}
    )
    assert len(keys) == 2 and not np.array_equal(keys[0], keys[1])  # each batch its own key
    assert evaluator(params=None) == values  # and the same keys each evaluation
    assert Evaluator(eval_step, list, lambda b: b, seed=0, derive=dict)(None) == {}


def test_a_metric_without_counts_is_nan_and_a_clash_is_refused():
    assert math.isnan(evaluate.means((4.0, 2.0, {}, {"acc": (0.0, 0.0)}))["eval/acc"])
    assert evaluate.means((0.0, 0.0, {}, {})) == {}
    with pytest.raises(ValueError, match="metric 'mse': the objective already reports eval/mse"):
        evaluate.means((4.0, 2.0, {"mse": 1.0}, {"mse": (1.0, 1.0)}))


def test_eval_every_null_never_evaluates_the_held_out_data_the_last_step_included():
    """The config's contract: ``trainer.eval_every`` None is "never validate". Every N steps and at
    the last otherwise; the downstream tasks (``trainer.evals``) still score the last step."""
    from types import SimpleNamespace

    from dew.training.eval_hooks import Evaluate

    def loop(every: int | None, tasks_every: int | None = None, tasks: bool = False, steps: int = 10) -> list[tuple]:
        ran: list[tuple] = []
        story = SimpleNamespace(evaluated=lambda step, values: ran.append(("report", step, dict(values))))
        tracker = SimpleNamespace(metrics=lambda step, values: None, event=lambda *a, **k: None)
        scorer = (lambda params: {"eval/task": 0.5}) if tasks else None
        hook = Evaluate(lambda params: {"eval/loss": 1.0}, story, tracker, every, scorer, tasks_every)  # type: ignore[arg-type]
        for step in range(1, steps + 1):
            at = At(step=step, records=step, state=SimpleNamespace(params=None), metrics={}, last=step == steps)  # type: ignore[arg-type]
            if hook.due(step, at.last):
                hook.on_step(at)
                assert at.evaluation == hook.last and hook.step == step
        return ran

    assert loop(None) == []  # not even the last step (it was evaluated until 2026-12-07)
    assert [step for _, step, _ in loop(4)] == [4, 8, 10]
    assert loop(None, tasks=True) == [("report", 10, {"eval/task": 0.5})]  # the tasks' last step alone
    assert loop(4, tasks_every=5, tasks=True) == [
        ("report", 4, {"eval/loss": 1.0}),
        ("report", 5, {"eval/task": 0.5}),
        ("report", 8, {"eval/loss": 1.0}),
        ("report", 10, {"eval/loss": 1.0, "eval/task": 0.5}),
    ]


def test_metrics_are_reported_once_when_flushed_and_a_nonfinite_step_stops():
    reported, checked = [], []
    reporter = Reporter(
        lambda s, v: reported.append((s, dict(v))), measure=lambda records: {"records": records}, every=4
    )
    hooks = Hooks(
        [reporter],
        derive=lambda v: {"d": 2 * v["loss"]},
        check_finite=checked.append,
        restart=lambda records: None,
        phase=lambda kind: contextlib.nullcontext(),
    )
    hooks.flush(state="s0")  # nothing held: nothing fetched
    hooks.after(At(3, 96, "s0", {"loss": jnp.float32(0.7), NONFINITE: jnp.int32(-1)}, last=False))  # not due
    hooks.after(At(4, 128, "s0", {"loss": jnp.float32(0.5), NONFINITE: jnp.int32(-1)}, last=False))
    assert reported == []  # held on the devices until the next step
    hooks.flush(state="s1")
    hooks.flush(state="s2")
    assert reported == [(4, {"loss": 0.5, "d": 1.0, "records": 128})] and checked == []
    hooks.after(At(5, 160, "s2", {"loss": jnp.float32(jnp.nan), NONFINITE: jnp.int32(4)}, last=True))
    hooks.flush(state="s3")
    assert checked == ["s3"]


class _Checkpoints:
    def __init__(self) -> None:
        self.saved: dict[int, tuple[dict, Any]] = {}

    def save(self, step: int, state: Any, meta: dict, metrics: Any) -> None:
        self.saved[step] = (meta, metrics)

    def wait(self) -> None:
        pass

    def latest_step(self) -> int | None:
        return max(self.saved, default=None)

    def step_path(self, step: int) -> str:
        return f"/runs/r/{step}"


class _Tracker:
    wandb_id = "w1"
    mlflow_id = "m1"

    def __init__(self) -> None:
        self.resume_ids = {"wandb": "w1", "mlflow": "m1"}
        self.events: list[tuple[str, int]] = []

    def event(self, kind: str, *, step: int, **fields: Any) -> None:
        self.events.append((kind, step))


class _Stop:
    reason, received = "preempted", 12


class _State:
    def __init__(self, nonfinite_step: int = -1) -> None:
        self.nonfinite_step = jnp.int32(nonfinite_step)


def _saver(last_saved: int | None = None) -> Saver:
    return Saver(
        _Checkpoints(),
        _Tracker(),
        data_state=lambda: {"pos": np.int64(7), "seq": (np.float32(0.5),)},
        stages=[(16, 4), (32, 0)],
        total_steps=10,
        last_saved=last_saved,
    )


def test_a_save_records_where_the_run_is_and_a_stop_saves_once():
    saver = _saver()
    saver.save(6, 160, _State(), metrics={"eval/loss": 1.0})
    meta, metrics = saver.checkpoints.saved[6]
    assert meta == {
        "step": 6,
        "records": 160,
        "data": {"pos": 7, "seq": [0.5]},
        "wandb_id": "w1",
        "mlflow_id": "m1",
        "ramp_stage": 1,
        "total_steps": 10,
    }
    assert type(meta["data"]["pos"]) is int and metrics == {"eval/loss": 1.0}
    stopped = saver.stopped(_Stop(), 6, 160, _State())  # saved there already: no second save
    assert isinstance(stopped, Preempted) and stopped.step == 6 and stopped.path == "/runs/r/6"
    assert saver.tracker.events == [("checkpoint", 6), ("stop", 6)]
    saver.stopped(_Stop(), 7, 176, _State())
    assert sorted(saver.checkpoints.saved) == [6, 7] and saver.tracker.events[-2:] == [("checkpoint", 7), ("stop", 7)]
    saver.last(7, 176, _State(), {})  # the last step is saved: nothing more
    assert sorted(saver.checkpoints.saved) == [6, 7]


def test_a_nonfinite_state_is_never_saved_and_names_the_last_good_checkpoint():
    saver = _saver()
    saver.save(2, 32, _State(), metrics=None)
    with pytest.raises(NonFiniteError, match=r"non-finite at step 4; .* left intact: step 2 in /runs/r/2"):
        saver.stopped(_Stop(), 4, 64, _State(nonfinite_step=3))
    assert sorted(saver.checkpoints.saved) == [2]
    assert plain({1: [np.int32(2)]}) == {"1": [2]}


def test_the_profiling_window(monkeypatch):
    calls = []
    monkeypatch.setattr("jax.profiler.start_trace", lambda d: calls.append(("start", d)))
    monkeypatch.setattr("jax.profiler.stop_trace", lambda: calls.append(("stop",)))

    class Window:
        warmup, steps, directory = 2, 3, "/tmp/trace"

    profiler = Profiler(Window())
    for step in range(8):
        profiler.before(step)
        profiler.after(step + 1, state=jnp.zeros(()))
    profiler.close()
    assert calls == [("start", "/tmp/trace"), ("stop",)]
    assert not Profiler(None).tracing


def test_the_lock_is_taken_once_per_run_and_nothing_is_remembered(tmp_path: Path):
    assert not hasattr(trainer, "_checked") and not hasattr(rundir, "_held")
    for _ in range(2):  # a notebook that trains two runs in turn: each takes and releases the lock
        with contextlib.ExitStack() as held:
            held.enter_context(rundir.hold(tmp_path / "run"))
            with pytest.raises(rundir.RunLockedError), rundir.hold(tmp_path / "run"):
                pass  # a second hold in the same run is refused: the set-up holds it once
