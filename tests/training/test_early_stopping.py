"""Early stopping (``trainer.early_stopping``): the rule stops a run at the evaluation it says, the
run ends as a finished one (its checkpoint, ``early_stop`` and ``end`` in the journal, ``dew-runs``
says "stopped early"), a resume of it trains nothing, and a run preempted on the way resumes with
the rule's count as it stood and stops at the same step as an uninterrupted one."""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from etils import epath

from dew.config import EarlyStopping
from dew.training.early_stopping import EarlyStop, EarlyStoppingMetricError, watched
from dew.training.hooks import At, Hook, hooks
from dew.training.preemption import Preempted, StopRequest, StopSignals
from tests.training.conftest import compose, journal, load_params, losses, steps_on_disk, train_tiny

# A tiny digits run whose eval/loss keeps falling, ever more slowly: with min_delta 0.02 the gains
# drop under it and the rule stops the run at step 33 of 36 (an evaluation every 3 steps).
RUN = [
    "trainer.steps=36",
    "trainer.eval_every=3",
    "trainer.checkpoint_every=null",
    "optim.learning_rate=3e-2",
    "trainer.early_stopping={patience: 2, min_delta: 0.02}",
]


def expected_stop(evals: list[tuple[int, float]], patience: int, min_delta: float, warmup: int = 0) -> int | None:
    """The rule, written out again: the step of the evaluation it stops at (lower is better)."""
    best, waited = math.inf, 0
    for n, (step, value) in enumerate(evals, 1):
        if math.isfinite(value) and best - value > min_delta:
            best, waited = value, 0
        else:
            waited += 1
        if n > warmup and waited >= patience:
            return step
    return None


def evals_of(records: list[dict]) -> list[tuple[int, float]]:
    return [(r["step"], r["eval/loss"]) for r in records if r.get("event") == "eval"]


@hooks.register("interrupt_at")
class InterruptAt(Hook):
    """Ctrl-C to this process at one step: the run stops there as on a real one, with a checkpoint."""

    def __init__(self, every: int = 1, step: int = 0) -> None:
        super().__init__(every)
        self.step = step

    def on_step(self, at: At) -> None:
        if at.step == self.step:
            os.kill(os.getpid(), signal.SIGINT)


def rule(**fields: float) -> EarlyStop:
    return EarlyStop(EarlyStopping(**fields), "eval/loss", False)  # type: ignore[arg-type]


def test_the_rule_counts_evaluations_without_a_gain_over_min_delta():
    values = [1.0, 0.95, 0.949, float("nan"), 0.9, 0.95, 0.96, 0.5]
    evals = list(zip(range(10, 90, 10), values))
    for patience, min_delta, warmup in ((1, 0.0, 0), (2, 0.0, 0), (2, 0.01, 0), (1, 0.0, 4), (3, 0.0, 0)):
        hook = rule(patience=patience, min_delta=min_delta, warmup=warmup)
        stops = [step for step, v in evals if hook.observe(step, {"eval/loss": v}) is not None]
        assert (stops[0] if stops else None) == expected_stop(evals, patience, min_delta, warmup)
    hook = rule(patience=2, min_delta=0.01)
    requests = [hook.observe(step, {"eval/loss": v}) for step, v in evals[:4]]
    assert requests[:3] == [None, None, None] and isinstance(requests[3], StopRequest)  # 0.949 and nan: no gain
    assert requests[3].reason == "early_stopping" and requests[3].details["best_step"] == 20
    assert hook.state() == {"metric": "eval/loss", "best": 0.95, "best_step": 20, "waited": 2, "evaluations": 4}
    higher = EarlyStop(EarlyStopping(patience=1), "eval/accuracy", True)
    assert higher.observe(1, {"eval/accuracy": 0.5}) is None and higher.observe(2, {"eval/accuracy": 0.6}) is None
    assert higher.observe(3, {"eval/accuracy": 0.55}) is not None
    with pytest.raises(EarlyStoppingMetricError, match=r"metric='eval/loss' is not among .*: eval/accuracy$"):
        rule().observe(1, {"eval/accuracy": 0.5})


def test_the_metric_and_its_direction_default_to_the_best_checkpoints():
    class Accuracy:
        name, higher_is_better = "accuracy", True

    metrics = [Accuracy()]
    assert watched(EarlyStopping(), metrics, ("eval/loss", False)) == ("eval/loss", False)  # type: ignore[arg-type]
    assert watched(EarlyStopping(), metrics, ("eval/accuracy", True)) == ("eval/accuracy", True)  # type: ignore[arg-type]
    assert watched(EarlyStopping(metric="eval/accuracy"), metrics, ("eval/loss", False)) == ("eval/accuracy", True)  # type: ignore[arg-type]
    assert watched(EarlyStopping(metric="eval/accuracy", mode="min"), metrics, ("eval/loss", False))[1] is False  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "value,message",
    [
        ("{metric: train/loss}", r"trainer.early_stopping.metric='train/loss' must be an evaluation value"),
        ("{patience: 0}", r"trainer.early_stopping.patience=0 must be >= 1"),
        ("{min_delta: -0.1}", r"trainer.early_stopping.min_delta=-0.1 must be finite and >= 0"),
        ("{warmup: -1}", r"trainer.early_stopping.warmup=-1 must be >= 0"),
        ("{mode: up}", r"trainer.early_stopping.mode"),
    ],
)
def test_a_bad_rule_is_refused_naming_the_field(value, message):
    with pytest.raises(Exception, match=message):
        compose(f"trainer.early_stopping={value}")


def test_early_stopping_needs_evaluations():
    with pytest.raises(ValueError, match=r"trainer.early_stopping is set but trainer.eval_every=null"):
        compose("trainer.early_stopping={}", "trainer.eval_every=null")


def test_a_stop_request_stops_at_the_next_boundary_and_the_first_one_stands():
    stop = StopSignals()
    assert not stop.stop_at(1)
    stop.request(StopRequest("early_stopping", "first"))
    stop.request(StopRequest("pruned", "second"))
    assert stop.stop_at(2) and stop.requested is not None and stop.requested.message == "first"
    assert StopRequest.from_json(stop.requested.to_json()) == stop.requested


@pytest.mark.slow
def test_early_stopping_stops_where_the_rule_says_and_survives_a_preemption(tmp_path: Path):
    from dew.cli.runs import run as dew_runs
    from dew.runs.status import read_run

    cache = f"trainer.compilation_cache_dir={tmp_path / 'xla'}"  # the later runs load the first one's programs
    # Uninterrupted: the stop is the evaluation the rule picks from the journal's own values.
    _, whole, whole_journal = train_tiny(tmp_path, *RUN, cache, name="whole")
    evals = evals_of(whole_journal)
    stop = expected_stop(evals, patience=2, min_delta=0.02)
    assert stop is not None and stop < 36 and evals[-1][0] == stop
    events = [(r["event"], r["step"]) for r in whole_journal if r.get("event") in ("early_stop", "end")]
    assert events == [("early_stop", stop), ("end", stop)] and steps_on_disk(whole) == [stop]
    assert max(losses(whole_journal)) <= stop
    summary = read_run(epath.Path(whole), "whole", tracking=str(tmp_path / "tracking")).summary
    assert summary.status == "stopped early" and summary.reason.startswith("early_stopping: eval/loss did not improve")
    assert "stopped early" in dew_runs([str(whole), "--tracking", str(tmp_path / "tracking")])

    # Launched again, it trains nothing and writes nothing.
    before = (tmp_path / "tracking" / "whole" / "journal.jsonl").read_text()
    train_tiny(tmp_path, *RUN, cache, name="whole")
    assert (tmp_path / "tracking" / "whole" / "journal.jsonl").read_text() == before
    assert steps_on_disk(whole) == [stop]

    # Preempted one step after an evaluation that did not gain (the count at 1, the best before it):
    # the resumed run needs both from the checkpoint to stop where the uninterrupted one did.
    waiting = evals[-2][0]  # the count reaches patience (2) at the stop: it was 1 at the evaluation before
    assert expected_stop(evals[-2:], 1, 0.02) == stop and waiting < stop
    interrupt = f"trainer.hooks=[{{name: interrupt_at, options: {{step: {waiting + 1}}}}}]"
    with pytest.raises(Preempted) as stopped:
        train_tiny(tmp_path, *RUN, cache, interrupt, name="cut")
    assert stopped.value.step == waiting + 1
    _, cut, cut_journal = train_tiny(tmp_path, *RUN, cache, interrupt, name="cut")  # the same command resumes it
    kinds = [(r["event"], r["step"]) for r in cut_journal if r.get("event") in ("stop", "resume", "early_stop", "end")]
    assert kinds == [("stop", waiting + 1), ("resume", waiting + 1), ("early_stop", stop), ("end", stop)]
    assert evals_of(cut_journal) == evals and losses(cut_journal) == losses(whole_journal)
    a, b = load_params(whole, stop), load_params(cut, stop)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert next(r for r in journal(tmp_path, "cut") if r.get("event") == "early_stop")["waited"] == 2
