"""A new per-step behaviour is a hook: registered by name, named in ``trainer.hooks`` with its
cadence, and run by the loop without editing it."""

from __future__ import annotations

import pytest

from dew.training.hooks import At, Hook, hooks
from tests.training.conftest import compose, losses, train_tiny

LOSSES: list[tuple[int, float]] = []


@hooks.register("record_loss")
class RecordLoss(Hook):
    """The training loss every ``every`` steps (and at the last), as numbers, one step late."""

    late = True

    def on_step(self, at: At) -> None:
        LOSSES.append((at.step, at.metrics["train/loss"]))


@pytest.mark.slow
def test_a_hook_added_by_name_runs_at_its_cadence_without_editing_the_loop(tmp_path):
    LOSSES.clear()
    _, _, journal = train_tiny(tmp_path, "trainer.steps=5", "trainer.hooks=[{name: record_loss, every: 2}]")
    logged = losses(journal)  # log_every=1: the journal has every step's loss
    assert [step for step, _ in LOSSES] == [2, 4, 5]
    assert [(step, logged[step]) for step in (2, 4, 5)] == LOSSES


def test_an_unknown_hook_or_a_bad_option_is_refused_naming_the_field():
    from dew.training.setup import from_config

    for spec, message in (
        ({"name": "nope"}, r"trainer.hooks\[0\]: unknown hook 'nope'; known: .*record_loss"),
        (
            {"name": "record_loss", "options": {"colour": 1}},
            r"trainer.hooks\[0\]: hook 'record_loss' does not take options \{'colour': 1\}",
        ),
    ):
        with pytest.raises(ValueError, match=message):
            from_config(compose(f"trainer.hooks=[{spec}]".replace("'", "")).trainer.hooks)
    with pytest.raises(ValueError, match=r"hook 'record_loss': every=0 must be >= 1"):
        compose("trainer.hooks=[{name: record_loss, every: 0}]")


class SaysNoAtTheEnd(Hook):
    """Fails at the last step, after the step's checkpoint (as the final samples run)."""

    after_checkpoint = True

    def __init__(self) -> None:
        super().__init__(every=None)

    def on_step(self, at: At) -> None:
        raise RuntimeError(f"no samples at step {at.step}")


@pytest.mark.slow
def test_a_hook_after_the_checkpoint_that_fails_costs_no_save(tmp_path):
    from dew.build import build_run
    from dew.training.trainer import train

    recipe, objective, dataset = build_run(
        compose(f"trainer.checkpoint_dir={tmp_path / 'ck'}", "trainer.steps=3", "trainer.checkpoint_every=null")
    )
    with pytest.raises(RuntimeError, match="no samples at step 3"):
        train(recipe, objective, dataset, name="run", hooks=[SaysNoAtTheEnd()])
    assert (tmp_path / "ck" / "run" / "3").is_dir()  # the last step's checkpoint was written first
