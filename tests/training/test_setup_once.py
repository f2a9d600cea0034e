"""One set-up for every way a run starts: ``RunConfig.train`` from Python and ``dew-train`` both call
``dew.training.setup.set_up``, and its phases are called nowhere else."""

from __future__ import annotations

import ast
import contextlib
import types
from pathlib import Path

import pytest

from dew.training import setup as setups

DEW = Path(__file__).resolve().parents[2] / "dew"
PHASES = ("start_process", "listen", "check_setup", "claim", "set_up")


def callers() -> dict[str, set[tuple[str, str]]]:
    """Each phase's callers in dew/, as (file under dew/, enclosing top-level function)."""
    found: dict[str, set[tuple[str, str]]] = {p: set() for p in PHASES}
    for path in sorted(DEW.rglob("*.py")):
        for top in ast.parse(path.read_text()).body:
            if not isinstance(top, (ast.FunctionDef, ast.ClassDef)):
                continue
            for node in ast.walk(top):
                if isinstance(node, ast.Call):
                    name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                    if name in found:
                        found[name].add((path.relative_to(DEW).as_posix(), top.name))
    return found


def test_python_and_dew_train_set_a_run_up_through_one_function():
    found = callers()
    assert found["set_up"] == {
        ("training/trainer.py", "train"),
        ("cli/train.py", "train_from_hydra"),
        ("cli/recipe.py", "train_recipe"),  # dew-recipe, the tyro door
    }
    for phase in ("listen", "check_setup", "claim"):
        assert found[phase] == {("training/setup.py", "set_up")}, phase
    # dew-train --check sets the process's flags to count its devices, dew-eval joins the process pool
    # to evaluate, dew-sample and dew-export take the run's flags and compilation cache (restore's
    # start=True): none of them sets a run up.
    assert found["start_process"] == {
        ("training/setup.py", "set_up"),
        ("cli/train.py", "check_single_run"),
        ("inference/evaluating.py", "run"),
        ("inference/restore.py", "restore"),
    }


def test_the_verdict_comes_between_the_checks_and_the_claim(monkeypatch):
    """``agree`` hears this process's error (then the error is raised and nothing is claimed), or
    None once the checks passed, before the lock is taken."""
    order: list[str] = []
    monkeypatch.setattr(setups, "start_process", lambda t: order.append("process"))
    the_setup = types.SimpleNamespace(path="the run's path")
    monkeypatch.setattr(setups, "check_setup", lambda *a: order.append("check") or the_setup)
    monkeypatch.setattr(setups, "claim", lambda run, setup, held: order.append(f"claim {setup.path}"))
    monkeypatch.setattr(setups, "record_tokenizer", lambda path, dataset: order.append(f"tokenizer of the {dataset}"))
    planned = setups.Planned("run", "objective", "dataset", "name")  # type: ignore[arg-type]
    trainer = types.SimpleNamespace(max_time_seconds=lambda: None)  # no trainer.max_time
    with contextlib.ExitStack() as held:
        got = setups.set_up(
            trainer,  # type: ignore[arg-type]
            held,
            lambda: planned,  # type: ignore[arg-type]
            agree=lambda err: order.append(f"agree {err}"),
        )
    assert got == (planned, the_setup)
    # process 0 records the data's tokenizer in the run it claimed
    assert order == ["process", "check", "agree None", "claim the run's path", "tokenizer of the dataset"]

    order.clear()

    def refused() -> setups.Planned:
        raise ValueError("trainer.batch_size=0: must be > 0")

    with contextlib.ExitStack() as held, pytest.raises(ValueError, match="batch_size=0"):
        setups.set_up(trainer, held, refused, agree=lambda err: order.append(f"agree {err}"))  # type: ignore[arg-type]
    assert order == ["process", "agree trainer.batch_size=0: must be > 0"]


def test_a_run_whose_journal_is_damaged_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    from dew.build import build_run
    from dew.training.run_directory import RunDirError
    from tests.training.conftest import compose

    monkeypatch.delenv("DEW_TRACKING_DIR", raising=False)
    run, objective, dataset = build_run(compose(f"trainer.checkpoint_dir={tmp_path / 'ck'}", "trainer.steps=2"))
    journal = tmp_path / "tracking" / "r" / "journal.jsonl"
    journal.parent.mkdir(parents=True)
    journal.write_text('{"event": "start", "step": 0}\n{"step": 1, "tr\n{"step": 2, "train/loss": 1.0}\n')
    with (
        contextlib.ExitStack() as held,
        pytest.raises(
            RunDirError,
            match=(r"the run's journal cannot be read, so the run is not resumed: .*journal.jsonl: line 2 is not JSON"),
        ),
    ):
        setups.set_up(run.trainer, held, lambda: setups.Planned(run, objective, dataset, "r"))
    assert not (tmp_path / "ck").exists()
