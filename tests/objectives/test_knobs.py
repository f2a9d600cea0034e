"""Objective knobs: overridable from the command line, recorded in run.json, restored by load."""

from __future__ import annotations

from pathlib import Path

import pytest

from dew.objectives.masked_diffusion import MaskedDiffusionKnobs
from dew.objectives.next_token import NextTokenKnobs
from dew.recipe import Recipe
from tests.conftest import dew, tree


def test_knobs_round_trip_through_run_json(tmp_path: Path):
    recipe = Recipe(
        masked_diffusion=MaskedDiffusionKnobs(eps=0.01, sample_steps=9),
        next_token=NextTokenKnobs(top_k=40, temperature=0.7),
    )
    recipe.save(str(tmp_path))
    loaded = Recipe.load(str(tmp_path))
    assert loaded.masked_diffusion == recipe.masked_diffusion and loaded.next_token == recipe.next_token


@pytest.mark.slow
def test_knobs_are_command_line_overrides(workdir: Path):
    result = dew("--cfg", "job", "masked_diffusion.eps=0.01", "next_token.top_k=40", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert "eps: 0.01" in result.stdout and "top_k: 40" in result.stdout
    bad = dew("masked_diffusion.eps=2", cwd=workdir)
    assert bad.returncode != 0 and "masked_diffusion.eps=2" in bad.stderr
    assert tree(workdir) == []


def test_a_built_objective_names_itself_by_its_knobs():
    """The loss modules do not import their registration back: a summary's ``objective`` is the name
    registered for the knobs' class."""
    from dew.config import ModelConfig
    from dew.contract.objectives import objective_of, objectives
    from dew.objectives.autoregressive import NextToken

    assert {name: objective_of(spec.Knobs()) for name, spec in objectives.items()} == {
        name: name for name in objectives
    }
    model = ModelConfig("transformer", {"hidden_size": 32, "depth": 1, "num_heads": 2}, dtype="float32")
    assert NextToken(model, NextTokenKnobs(), 11, 8).summary()["objective"] == "next_token"
    with pytest.raises(ValueError, match="knobs of no registered objective"):
        objective_of(Recipe())
