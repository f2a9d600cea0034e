"""How a search's trial ends in its study (``hydra/sweeper=optuna``): its value told, PRUNED with the
intermediate values its journal holds, or FAIL with why, one line (``STUDY_FAIL_REASON``); by the
sweeping command (``dew.launching.search.study_sweeper``) and by a worker
(``dew.launching.search.study_workers``) alike."""

from __future__ import annotations

import logging
import math
from typing import Any

import optuna

from dew import compat
from dew.contract.rundir import STUDY_FAIL_REASON
from dew.launching.search.pruning import replay
from dew.launching.search.trial import TrialOutcome

log = logging.getLogger("dew")

FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)


def record(study: optuna.Study, number: int, ret: Any) -> str | None:
    """Tell the study how trial ``number`` ended (``ret``: Hydra's ``JobReturn``, whose
    ``return_value`` raises the trial's own error, or the exception that says why there is none):
    its value, PRUNED with its intermediate values, or FAIL; the failure's message, else None."""
    try:
        if isinstance(ret, BaseException):
            raise ret
        outcome = ret.return_value  # raises the trial's own error when it failed
        value = float(outcome)
        if not math.isfinite(value):
            raise ValueError(f"its value is {value}")
    except Exception as err:
        return fail(study, number, one_line(err))
    if isinstance(outcome, TrialOutcome):  # what it reported to its pruner, as Optuna keeps it
        replay(study, number, outcome.journal, outcome.metric)
    if isinstance(outcome, TrialOutcome) and outcome.pruned:
        log.info("trial %d was pruned (its value so far: %s)", number, value)
        tell(study, number, state=optuna.trial.TrialState.PRUNED)
    else:
        tell(study, number, value)
    return None


def fail(study: optuna.Study, number: int, message: str) -> str:
    """Record trial ``number`` FAIL, with ``message`` as its ``STUDY_FAIL_REASON``; return the message."""
    log.warning("trial %d failed: %s", number, message)
    compat.optuna_trial(study, number).set_user_attr(STUDY_FAIL_REASON, message)
    tell(study, number, state=optuna.trial.TrialState.FAIL)
    return message


def one_line(err: BaseException) -> str:
    """An error and the errors that caused it, the first line of each, on one line (Hydra's
    ``Error merging override ...`` says what, its cause says why)."""
    parts: list[str] = []
    cause: BaseException | None = err
    while cause is not None and len(parts) < 3:
        if line := str(cause).strip().split("\n", 1)[0].strip():
            parts.append(line)
        cause = cause.__cause__
    return ": ".join(parts) or type(err).__name__


def tell(study: optuna.Study, number: int, *args: Any, **kwargs: Any) -> None:
    """``study.tell``, which records the trial and then runs the sampler's ``after_trial``; the grid
    sampler's calls ``study.stop()`` once the grid is covered, which raises outside
    ``study.optimize`` (the trial is recorded by then, and the trial count ends the sweep anyway)."""
    try:
        study.tell(number, *args, **kwargs)
    except RuntimeError as err:
        if "Study.stop" not in str(err):
            raise


def overrides_of(params: dict[str, Any], fixed: dict[str, Any]) -> tuple[str, ...]:
    """A trial's overrides, its parameters then the fixed values, so a resumed trial's job directory
    has the name it had."""
    return tuple(f"{k}={v}" for k, v in {**params, **fixed}.items())
