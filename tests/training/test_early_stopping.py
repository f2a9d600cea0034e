"""Early stopping (``trainer.early_stopping``): the rule stops a run at the evaluation it says, the
run ends as a finished one (its checkpoint, ``early_stop`` and ``end`` in the journal, ``dew-runs``
says "stopped early"), a resume of it trains nothing, and a run preempted on the way resumes with
the rule's count as it stood and stops at the same step as an uninterrupted one."""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from etils import epath

from dew.config import EarlyStopping
from dew.training import early_stopping
from dew.training.early_stopping import EarlyStop, EarlyStoppingMetricError, watched
from dew.training.hooks import At, Hook, hooks
from dew.training.preemption import Preempted, StopRequest, StopSignals
from tests.conftest import SUITE_CACHE, dew
from tests.training.conftest import TINY, compose, journal, load_params, losses, steps_on_disk, train_tiny

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


class Top:
    """A metric of a run's own (``RunConfig.train(metrics=...)``), by its name alone."""

    name, best, higher_is_better = "top", False, True


def built_in_objectives() -> dict[str, tuple[Any, dict[str, Any]]]:
    """dew's objectives, tiny, as their own tests build them, each with a batch's shapes (no mask)."""
    from dew.config import ModelConfig
    from dew.objectives.autoregressive import NextToken
    from dew.objectives.flow_matching import FlowMatchingKnobs
    from dew.objectives.masked_diffusion import MaskedDiffusionKnobs
    from dew.objectives.mdlm import MaskedDiffusion
    from dew.objectives.next_token import NextTokenKnobs
    from dew.objectives.rectified_flow import FlowMatching

    tiny = {"hidden_size": 32, "depth": 1, "num_heads": 2}
    dit = ModelConfig(
        "simple_dit", {**tiny, "patch_size": 2, "input_size": 8, "in_channels": 1, "num_classes": 10}, dtype="float32"
    )
    lm = ModelConfig("transformer", {**tiny, "vocab_size": 13, "seq_len": 8}, dtype="float32")
    mdlm = ModelConfig("simple_dit", {**tiny, "vocab_size": 12, "input_size": 8, "num_classes": 0}, dtype="float32")
    tokens = {"tokens": ((4, 9), np.int32)}
    return {
        "flow_matching": (
            FlowMatching(dit, FlowMatchingKnobs(), 10, (8, 8, 1)),
            {"image": ((4, 8, 8, 1), np.float32), "label": ((4,), np.int32)},
        ),
        "next_token": (NextToken(lm, NextTokenKnobs(), 13, 8), tokens),
        "masked_diffusion": (MaskedDiffusion(mdlm, MaskedDiffusionKnobs(), 11, 8), tokens),
    }


def test_each_objective_declares_the_sums_its_evaluation_reports():
    """``eval_sums``, what the check before a run reads, is what ``evaluate`` returns (traced, not run)."""
    import jax
    from flax import nnx

    from dew.contract.objectives import objectives

    built = built_in_objectives()
    assert {n for n, spec in objectives.items() if spec.__module__.startswith("dew.")} == set(built)
    for name, (objective, spec) in built.items():
        graphdef, state = nnx.split(nnx.eval_shape(lambda o=objective: o.build(nnx.Rngs(params=0))))
        batch = {k: jax.ShapeDtypeStruct(shape, dtype) for k, (shape, dtype) in spec.items()}
        batch["mask"] = jax.ShapeDtypeStruct((4,), np.float32)
        key = jax.ShapeDtypeStruct((2,), np.uint32)

        def evaluate(state, batch, key, objective=objective, graphdef=graphdef):
            return objective.evaluate(nnx.merge(graphdef, state), batch, key)

        out = jax.eval_shape(evaluate, state, batch, key)
        assert tuple(out.sums) == objective.eval_sums, name


def test_the_watched_metric_is_checked_against_what_the_evaluations_report():
    """Before the run: eval/loss, the objective's own values and derived ones, its metrics' pass; any
    other is refused naming the field, the value and the values reported."""
    from dew.objectives.metrics import builtin_metrics
    from dew.training.evaluate import reported

    next_token = built_in_objectives()["next_token"][0]
    metrics = builtin_metrics(next_token)
    assert reported(next_token, metrics) == ["eval/accuracy", "eval/bits_per_token", "eval/loss", "eval/perplexity"]
    for metric in (None, "eval/loss", "eval/accuracy", "eval/bits_per_token", "eval/perplexity"):
        early_stopping.check(EarlyStopping(metric=metric), next_token, metrics)
    early_stopping.check(None, next_token, metrics)
    with pytest.raises(EarlyStoppingMetricError) as refused:
        early_stopping.check(EarlyStopping(metric="eval/nonexistent"), next_token, metrics)
    assert str(refused.value) == (
        "trainer.early_stopping.metric='eval/nonexistent' is not among the values this run's evaluations report: "
        "eval/accuracy, eval/bits_per_token, eval/loss, eval/perplexity"
    )
    with pytest.raises(EarlyStoppingMetricError, match=r"report: eval/bits_per_token, eval/loss, eval/perplexity$"):
        early_stopping.check(EarlyStopping(metric="eval/accuracy"), next_token, ())  # a run without the metric
    # An objective that declares nothing is left to the first evaluation.
    assert reported(object(), metrics) is None
    early_stopping.check(EarlyStopping(metric="eval/nonexistent"), object(), metrics)


def test_the_run_checks_the_watched_metric_with_the_metrics_it_evaluates(tmp_path: Path):
    """``check`` (the set-up's, dew-train's and a launcher's) takes dew-train's metrics, or the run's
    own (``RunConfig.train``); a refused run writes nothing."""
    from dew.build import build_run
    from dew.training.trainer import check

    built = build_run(compose("trainer.steps=2", "trainer.early_stopping={metric: eval/top}"))
    with pytest.raises(EarlyStoppingMetricError, match=r"metric='eval/top' is not among .*: eval/loss$"):
        check(*built)  # flow_matching's own metrics: none
    check(*built, metrics=[Top()])  # type: ignore[list-item]
    with pytest.raises(EarlyStoppingMetricError, match=r"metric='eval/top' is not among"):
        train_tiny(tmp_path, "trainer.steps=2", "trainer.early_stopping={metric: eval/top}")
    assert not (tmp_path / "ck").exists() and not (tmp_path / "tracking").exists()


@pytest.mark.slow
def test_dew_train_refuses_a_metric_its_evaluations_do_not_report_and_writes_nothing(workdir: Path):
    """dew-train, its --check and a sweep's check of each job: one line, exit 2, before any step, and
    nothing written (not even the run directory that would then refuse the corrected command)."""
    bad = [*TINY, "trainer.steps=4", "trainer.early_stopping={metric: eval/nonexistent}", "trainer.checkpoint_dir=ck"]
    line = (
        "dew-train: error: trainer.early_stopping.metric='eval/nonexistent' is not among the values this run's "
        "evaluations report: eval/loss"
    )
    for args in (bad, ["--check", *bad]):
        result = dew(*args, cwd=workdir)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines() == [line]
        assert list(workdir.iterdir()) == []
    sweep = dew("-m", *bad, "optim.learning_rate=1e-3,1e-2", cwd=workdir)
    assert sweep.returncode == 2, sweep.stderr
    assert sweep.stderr.count(line.removeprefix("dew-train: error: ")) == 2, sweep.stderr
    assert list(workdir.iterdir()) == []


@pytest.mark.slow
def test_early_stopping_stops_where_the_rule_says_and_survives_a_preemption(tmp_path: Path):
    from dew.cli.runs import run as dew_runs
    from dew.runs.status import read_run

    cache = f"trainer.compilation_cache_dir={SUITE_CACHE}"  # the later runs load the first one's programs
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
