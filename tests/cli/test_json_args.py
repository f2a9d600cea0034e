"""JSON values on the command line: an override of a JSON field whose value is a JSON object or list
reaches Hydra as one string that parses back to the same text; everything else is untouched."""

from __future__ import annotations

import json

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from dew.commandline.json_args import json_fields, quote_json_overrides
from dew.recipe import Recipe

FIELDS = json_fields(Recipe)


def test_the_json_fields_of_a_run():
    assert {"model.config", "optim.optimizer_opts", "optim.param_groups"} == FIELDS


@pytest.mark.parametrize(
    "arg",
    [
        'model.config={"depth": 4}',
        'optim.optimizer_opts={"ns_steps": 3, "adam_patterns": ["embed", "head$"]}',
        'optim.param_groups=[{"pattern": "bias", "weight_decay": 0.0}]',
        '++model.config={"depth": 4}',
        """model.config={"note": "it's a \\\\ and a \\" inside"}""",
    ],
)
def test_a_json_value_reaches_hydra_as_its_own_text(arg):
    [quoted] = quote_json_overrides([arg], FIELDS)
    [parsed] = OverridesParser.create().parse_overrides([quoted])
    key, _, value = arg.lstrip("+").partition("=")
    assert parsed.key_or_group == key and parsed.value() == value
    assert json.loads(parsed.value()) == json.loads(value)


@pytest.mark.parametrize(
    "arg",
    [
        "model.config={depth: 4}",  # Hydra's own dict syntax
        "model.config.depth=4",
        "trainer.wandb={project: p}",
        "trainer.layout.batch_axes=[data]",
        'lora={"rank": 4}',  # not a JSON field: Hydra reads it (and refuses the quoted key)
        "-m",
    ],
)
def test_everything_else_is_left_alone(arg):
    assert quote_json_overrides([arg], FIELDS) == [arg]


def test_a_dotted_key_inside_a_json_field_is_set_whether_or_not_an_option_set_it():
    from dew.commandline.json_args import set_json_keys
    from tests.cli.test_compose import compose_recipe

    args = [
        "model=transformer",
        "model.config.mup=true",
        "model.config.hidden_size=96",
        "trainer.steps=3",
        "++model.config.depth=2",
        'optim.optimizer_opts={"b1": 0.8}',
        "+model.config.num_heads=4",
    ]
    assert set_json_keys(args, FIELDS) == [
        "model=transformer",
        "++model.config.mup=true",
        "++model.config.hidden_size=96",
        *args[3:6],
        "++model.config.num_heads=4",  # + too: whether the composition holds the key is not the user's to know
    ]
    # model=transformer sets no field: the key is added
    assert compose_recipe(*set_json_keys(args[:3], FIELDS)).model.config == {"mup": True, "hidden_size": 96}
    # experiment=tiny_lm set hidden_size and depth: one changes, one key joins, the rest stay
    recipe = compose_recipe(
        *set_json_keys(["experiment=tiny_lm", "+model.config.depth=2", "model.config.mup=true"], FIELDS)
    )
    assert recipe.model.config == {"hidden_size": 128, "depth": 2, "num_heads": 4, "mup": True}
