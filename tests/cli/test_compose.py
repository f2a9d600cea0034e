"""Every option of every config group composes and converts into the typed Recipe."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from dew.commandline.configs import conf_dir, register_configs
from dew.contract.data import datasets
from dew.contract.schedules import schedules
from dew.recipe import Recipe

CONF = Path(conf_dir())
GROUPS = ["model", "data", "optim", "optim/schedule", "trainer", "trainer/trackers", "experiment"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_recipe(*overrides: str) -> Recipe:
    GlobalHydra.instance().clear()
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    return Recipe.from_dict(OmegaConf.to_container(cfg, resolve=True))


def test_every_registered_dataset_and_schedule_has_an_option():
    assert options("data") == sorted(datasets)
    assert options("optim/schedule") == sorted(schedules)


def test_the_default_composes():
    recipe = compose_recipe()
    assert recipe.data.name == "digits" and recipe.model.architecture == "simple_dit"
    assert recipe.optim.optimizer == "adamw" and recipe.optim.schedule is None


@pytest.mark.parametrize("group, option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes_and_converts(group, option):
    overrides = [f"{group}={option}"]
    if group == "data" and option == "token_windows":
        overrides.append("data.path=/tmp/tokens.bin")
    if group == "data" and option == "text_stream":
        overrides.append("data.path=/tmp/text.txt")
    recipe = compose_recipe(*overrides)
    if group == "data":
        assert recipe.data.name == option
    elif group == "optim/schedule":
        assert recipe.optim.schedule.name == option  # type: ignore[union-attr]
    elif group == "optim":
        assert recipe.optim.optimizer == option
    elif group == "trainer/trackers" and option == "wandb":
        assert recipe.trainer.wandb is not None and recipe.trainer.wandb.project == "dew"
    elif group == "trainer/trackers":
        assert getattr(recipe.trainer.trackers, option) is not None
    elif group == "model":
        assert recipe.model.architecture in ("simple_dit", "transformer")
    assert Recipe.from_dict(recipe.to_dict()) == recipe


def test_overrides_reach_the_typed_fields():
    recipe = compose_recipe(
        "optim/schedule=power",
        "optim.schedule.decay_fraction=0.2",
        "model.config={depth: 3, num_heads: 2, hidden_size: 64}",
        "trainer.eval_every=epoch",
        "trainer.checkpoint_every=7",
        "trainer.batch_ramp={start: 8, increment: 8, records: 64}",
    )
    assert recipe.optim.schedule.decay_fraction == 0.2  # type: ignore[union-attr]
    assert recipe.model.config == {"depth": 3, "num_heads": 2, "hidden_size": 64}
    assert recipe.trainer.checkpoint_every == 7 and recipe.trainer.eval_every == "epoch"
    assert recipe.trainer.batch_ramp.start == 8  # type: ignore[union-attr]
    json_string = compose_recipe('model.config=\'{"depth": 3, "num_heads": 2, "hidden_size": 64}\'')
    assert json_string.model.config == recipe.model.config


def test_the_digits_experiment_states_only_differences():
    recipe = compose_recipe("experiment=digits")
    assert recipe.data.name == "digits" and recipe.optim.schedule.name == "cosine"  # type: ignore[union-attr]
    assert recipe.trainer.steps and recipe.model.dtype == "float32"


def test_the_cpu_transformer_is_small_and_float32():
    """README's text line: ``model=transformer_tiny`` over the data's choice, a CPU's size and dtype;
    ``model=transformer`` is the default's size (GPU-sized) in the dataclass's bfloat16."""
    tiny = compose_recipe("data=hf_text", "data.path=web/*.jsonl", "model=transformer_tiny")
    assert tiny.model.architecture == "transformer" and tiny.model.dtype == "float32"
    assert tiny.model.config == {"hidden_size": 128, "depth": 4, "num_heads": 4}
    full = compose_recipe("data=hf_text", "data.path=web/*.jsonl")
    assert full.model.architecture == "transformer" and full.model.dtype == "bfloat16" and full.model.config == {}


@pytest.mark.parametrize(
    "overrides, architecture",
    [
        ((), "simple_dit"),
        (("data=token_windows",), "transformer"),  # tokens bring the causal LM ...
        (("data=text_stream",), "transformer"),
        (("data=token_windows", "model=simple_dit"), "simple_dit"),  # ... unless the model is chosen
        (("model=dit_s2", "data=token_windows"), "simple_dit"),
        (("experiment=tiny_mdlm",), "simple_dit"),  # an experiment's choice wins over the data's
        (("experiment=tiny_lm",), "transformer"),
        (("data=oxford_flowers102",), "simple_dit"),
    ],
)
def test_the_default_model_follows_the_data(overrides, architecture):
    """docs/data.md: a token dataset with no model chosen trains the transformer (next-token), not
    the image default's DiT."""
    GlobalHydra.instance().clear()
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    assert cfg.model.architecture == architecture
