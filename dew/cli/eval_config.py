"""What ``dew-eval`` evaluates: the run's record (or a Hugging Face Llama directory's model) with the
command line's overrides, composed in dew-train's config groups, as the typed ``Recipe``.

A run's record is the base. An override of a field (``data.path=...``, ``trainer.batch_size=16``) sets
that field of the record. A group's option (``data=token_windows``) replaces the record's node at that
group's place with the option as dew-train composes it (its YAML over the dataclass's defaults), with
the command line's fields under it (``data=token_windows data.path=...``); nothing else of the
composition is taken, so the option's side effects on other groups (token_windows chooses the
``transformer`` model) leave the run's model alone. The presets that set a whole run (``experiment``,
``debug``, ``hparams_search``) are refused: the run is what it recorded.

A Hugging Face Llama directory has no record: the run is dew-train's composition of the command line
(which must choose token data), its model the ``transformer`` whose fields ``config.json`` gives, its
parameters the directory's (``trainer.init_from``, read by ``dew.training.checkpointing.warmstart``).

No JAX: a bad command line is answered before anything heavy loads.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dew.cli.overrides import check_overrides
from dew.contract.config import NoRunRecord, RunRecord
from dew.contract.rundir import RUN_RECORD
from dew.contract.typed import ConfigError
from dew.recipe import Recipe

GROUPS = ("data", "model", "optim", "optim/schedule", "trainer")
"""The config groups whose option replaces the record's node at the group's place."""
WHOLE_RUN = ("experiment", "debug", "hparams_search")
"""Presets of a whole run, refused: the run is what it recorded."""
HF_CONFIG = "config.json"


class EvalError(Exception):
    """A command line ``dew-eval`` cannot evaluate; the message says why, in one line."""


@dataclasses.dataclass(frozen=True)
class Target:
    """What is evaluated: a run directory or a Hugging Face Llama directory, and its composed recipe."""

    path: str
    """The directory named on the command line, absolute."""
    kind: str
    """``run`` (a dew run directory) or ``hf`` (a Hugging Face Llama directory)."""
    recipe: Recipe
    recorded: Recipe | None
    """The run's record as written (None for a Hugging Face directory)."""


def target(path: str, overrides: Sequence[str], conf: str) -> Target:
    """The run (or Hugging Face directory) at ``path`` with ``overrides`` applied, as a ``Recipe``."""
    if problem := check_overrides(overrides, Recipe):
        raise EvalError(problem)
    where = os.path.abspath(path)
    if os.path.isfile(os.path.join(where, RUN_RECORD)):
        try:
            record = RunRecord.read(where)
            recorded = record.typed(Recipe)
        except (NoRunRecord, ConfigError) as err:
            raise EvalError(str(err)) from None
        return Target(where, "run", _typed(compose_onto(record.values, overrides, conf)), recorded)
    if os.path.isfile(os.path.join(where, HF_CONFIG)):
        return Target(where, "hf", hf_recipe(where, overrides, conf), None)
    if not os.path.exists(where):
        raise EvalError(f"{path}: no such run directory")
    raise EvalError(f"{path}: neither a dew run directory (run.json) nor a Hugging Face Llama directory (config.json)")


def _typed(values: dict[str, Any]) -> Recipe:
    try:
        return Recipe.from_dict(values)
    except ConfigError as err:
        raise EvalError(str(err)) from None


def _parsed(overrides: Sequence[str]) -> list[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as err:
        raise EvalError(" ".join(str(err).split())) from None
    for o in parsed:
        if o.is_sweep_override():
            raise EvalError(f"{o.input_line}: dew-eval evaluates one configuration; give one value")
        if o.is_delete() or o.package:
            raise EvalError(f"{o.input_line}: dew-eval sets fields and chooses group options only")
    return parsed


def _group(key: str, conf: str) -> bool:
    return "." not in key and Path(conf, key).is_dir()


def compose_onto(record: dict[str, Any], overrides: Sequence[str], conf: str) -> dict[str, Any]:
    """``record`` (``run.json``'s values) with ``overrides`` applied (the module's docstring)."""
    from omegaconf import OmegaConf

    parsed = _parsed(overrides)
    chosen = [o for o in parsed if _group(o.key_or_group, conf)]
    for o in chosen:
        if o.key_or_group in WHOLE_RUN:
            raise EvalError(
                f"{o.input_line}: {o.key_or_group} presets a whole run; dew-eval evaluates the run as it "
                f"recorded: give the fields to change (data.path=...) or a group of {', '.join(GROUPS)}"
            )
        if o.key_or_group not in GROUPS:
            raise EvalError(f"{o.input_line}: dew-eval takes the config groups {', '.join(GROUPS)}")
    places = [o.key_or_group.replace("/", ".") for o in chosen]
    fields = [o for o in parsed if o not in chosen]
    under = [o for o in fields if any(o.key_or_group.lstrip("+").startswith(p + ".") for p in places)]
    cfg = OmegaConf.create(record)
    if chosen:
        composed = compose_config([o.input_line for o in chosen + under], conf)
        for place in places:
            OmegaConf.update(cfg, place, OmegaConf.select(composed, place), merge=False)
    for o in fields:
        if o in under:
            continue
        OmegaConf.update(cfg, o.key_or_group.lstrip("+"), o.value(), merge=False, force_add=True)
    values = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(values, dict)
    return {str(k): v for k, v in values.items()}


def compose_config(overrides: Sequence[str], conf: str) -> Any:
    """dew-train's composition of ``overrides`` (a ``DictConfig``), or an EvalError with Hydra's reason."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from dew.cli.train import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=conf, version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        raise EvalError(" ".join(str(err).split())) from None
    finally:
        GlobalHydra.instance().clear()


# ------------------------------------------------------------------------ a Hugging Face directory


def hf_model_config(directory: str) -> dict[str, Any]:
    """The ``transformer`` fields a Llama ``config.json`` gives (the sequence length comes from the
    data, and data of another vocabulary is refused by the data's fields); what dew's reader refuses
    (a tied head, biases) it refuses by name when it reads the weights."""
    from dew.training.checkpointing import hf_llama  # heavy: JAX

    try:
        fields = hf_llama.model_config(directory)
    except ValueError as err:
        raise EvalError(" ".join(str(err).split())) from None
    with open(os.path.join(directory, HF_CONFIG)) as fh:
        fields["vocab_size"] = json.load(fh)["vocab_size"]
    return fields


def hf_recipe(directory: str, overrides: Sequence[str], conf: str) -> Recipe:
    """dew-train's composition of ``overrides`` with the directory's model: its fields from
    ``config.json`` over the command line's ``model.config``, its parameters the directory's."""
    from omegaconf import OmegaConf

    _parsed(overrides)
    composed = compose_config(overrides, conf)
    values = OmegaConf.to_container(composed, resolve=True)
    assert isinstance(values, dict)
    model = values["model"]
    from dew.training.checkpointing.hf_llama import ARCHITECTURE  # heavy: JAX

    if model.get("architecture") != ARCHITECTURE:
        raise EvalError(
            f"{directory} holds a Llama: evaluate it on token data (data=token_windows data.path=... or "
            f"data=text_stream ...); the command line composes a {model.get('architecture')!r} model"
        )
    given = model.get("config") or {}
    given = json.loads(given) if isinstance(given, str) else given  # a JSON field, as the composition holds it
    model["config"] = {**given, **hf_model_config(directory)}
    values["trainer"]["init_from"] = directory
    values["trainer"]["name"] = os.path.basename(directory.rstrip("/")) or "hf"
    return _typed({str(k): v for k, v in values.items()})
