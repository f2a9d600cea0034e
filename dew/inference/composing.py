"""What ``dew-eval``, ``dew-sample`` and ``dew-export`` read: a run's record (or, for dew-eval, a
Hugging Face Llama, Qwen2, Qwen3 or Mistral directory's model) with the command line's overrides,
composed in dew-train's config groups, as the typed ``Recipe``.

The overrides are read as dew-train reads them (``dew.commandline.overrides.hydra_form`` and
``parse_overrides``: the one parser): plain values, quoted strings, lists, a JSON object or list for
a JSON field, ``+key=``, ``++key=``, ``~key``, dotted keys, ``null``. A run's record is the base,
and an override of a field is applied to it by Hydra's own rules (``compat.hydra_apply_overrides``),
as dew-train applies it to the config it composed: a plain key must be a field, ``+`` adds, ``~``
deletes (the field then takes its default), a dict value merges. A group's option
(``data=token_windows``) replaces the record's node at that group's place with the option as
dew-train composes it (its YAML over the dataclass's defaults), with the command line's fields under
it (``data=token_windows data.path=...``); nothing else of the composition is taken, so the option's
side effects on other groups (token_windows chooses the ``transformer`` model) leave the run's model
alone. The presets that set a whole run (``experiment``, ``debug``, ``hparams_search``) are refused:
the run is what it recorded; so are a sweep and Hydra's own settings (these commands run one
configuration, and no Hydra job).

A Hugging Face directory (or a hub name in the local cache) has no record: the run is dew-train's
composition of the command line (which must choose token data), its model the ``transformer`` whose
fields ``config.json`` gives (``hf_config.with_checkpoint_fields``: a ``model.config`` field the
command line sets otherwise is refused by name), its parameters the directory's (``trainer.init_from``,
read by ``dew.training.checkpointing.warmstart``).

No JAX: a bad command line is answered before anything heavy loads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dew import compat
from dew.commandline.configs import conf_dir, register_configs
from dew.commandline.exits import EXIT_BAD_INPUT
from dew.commandline.overrides import hydra_form, parse_overrides, unset_record
from dew.contract.config import NoRunRecord, RunRecord, hub_name
from dew.contract.rundir import RUN_RECORD
from dew.contract.typed import ConfigError
from dew.recipe import Recipe

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override

GROUPS = ("data", "model", "optim", "optim/schedule", "trainer")
"""The config groups whose option replaces the record's node at the group's place."""
WHOLE_RUN = ("experiment", "debug", "hparams_search")
"""Presets of a whole run, refused: the run is what it recorded."""
HF_CONFIG = "config.json"
HF_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM")
"""The Hugging Face architectures (``config.json``'s ``architectures``) dew reads
(``dew.training.checkpointing.hf_config.FAMILIES``, which a test holds to this list)."""


class EvalError(Exception):
    """A command line ``dew-eval`` cannot evaluate; the message says why, in one line."""


@dataclasses.dataclass(frozen=True)
class Target:
    """What is evaluated: a run directory or a Hugging Face directory, and its composed recipe."""

    path: str
    """The directory named on the command line, absolute."""
    kind: str
    """``run`` (a dew run directory) or ``hf`` (a Hugging Face directory)."""
    recipe: Recipe
    recorded: Recipe | None
    """The run's record as written (None for a Hugging Face directory)."""


def target(path: str, overrides: Sequence[str], conf: str, prog: str = "dew-eval") -> Target:
    """The run (or Hugging Face directory) at ``path`` with ``overrides`` applied, as a ``Recipe``."""
    parsed = read_overrides(overrides, prog)
    if hub_name(path):  # a model in the local Hugging Face cache
        from dew.training.checkpointing.hf_config import local_directory  # reads the cache: huggingface_hub

        try:
            path = local_directory(path, prog) or path
        except ValueError as err:
            raise EvalError(str(err)) from None
    where = os.path.abspath(path)
    if os.path.isfile(os.path.join(where, RUN_RECORD)):
        recipe, recorded = on_record(where, parsed, conf, prog)
        return Target(where, "run", recipe, recorded)
    if os.path.isfile(os.path.join(where, HF_CONFIG)):
        return Target(where, "hf", hf_recipe(where, parsed, conf), None)
    if not os.path.exists(where):
        raise EvalError(f"{path}: no such run directory")
    raise EvalError(
        f"{path}: neither a dew run directory (run.json), a Hugging Face model directory (config.json) nor "
        "a hub name in the local cache"
    )


def on_record(where: str, parsed: Sequence[Override], conf: str, prog: str) -> tuple[Recipe, Recipe]:
    """(the record of the run in ``where`` with the ``parsed`` overrides applied, the record as
    written), both typed."""
    try:
        record = RunRecord.read(where)
        recorded = record.typed(Recipe)
    except (NoRunRecord, ConfigError) as err:
        raise EvalError(str(err)) from None
    return _typed(compose_onto(record.values, parsed, conf, prog)), recorded


def shown(recipe: Recipe) -> str:
    """``recipe`` as YAML, as dew-train's ``--cfg job`` prints a config: what ``--cfg`` prints."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(recipe.to_dict())


def print_config(path: str, overrides: Sequence[str], prog: str) -> int:
    """``--cfg``: print the config ``prog`` would run (``shown``), or one line saying why there is
    none; the exit status (0, or 2 for a bad input)."""
    try:
        print(shown(target(path, overrides, conf_dir(), prog).recipe), end="", flush=True)
    except (EvalError, ConfigError, ValueError, OSError) as err:
        print(f"{prog}: error: {' '.join(str(err).split())}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    return 0


def _typed(values: dict[str, Any]) -> Recipe:
    try:
        return Recipe.from_dict(values)
    except ConfigError as err:
        raise EvalError(str(err)) from None


def read_overrides(overrides: Sequence[str], prog: str) -> list[Override]:
    """The command line's overrides, read as dew-train reads them (``hydra_form``,
    ``parse_overrides``), each one a command of one configuration and no Hydra job takes."""
    try:
        parsed = parse_overrides(hydra_form(overrides, Recipe), Recipe)
    except ValueError as err:
        raise EvalError(str(err)) from None
    for o in parsed:
        if o.is_sweep_override():
            raise EvalError(f"{o.input_line}: {prog} takes one configuration; give one value")
        if o.is_hydra_override():
            raise EvalError(f"{o.input_line}: {prog} runs no Hydra job; Hydra's settings do not apply")
        if o.package:
            raise EvalError(f"{o.input_line}: {prog} takes a group's option at the group's own place")
    return parsed


def _group(key: str, conf: str) -> bool:
    return "." not in key and Path(conf, key).is_dir()


def compose_onto(record: dict[str, Any], parsed: Sequence[Override], conf: str, prog: str) -> dict[str, Any]:
    """``record`` (``run.json``'s values) with the ``parsed`` overrides applied (the module's docstring)."""
    from omegaconf import OmegaConf, open_dict

    chosen = [o for o in parsed if _group(o.key_or_group, conf)]
    for o in chosen:
        if o.key_or_group in WHOLE_RUN:
            raise EvalError(
                f"{o.input_line}: {o.key_or_group} presets a whole run; {prog} takes the run as it "
                f"recorded: give the fields to change (data.path=...) or a group of {', '.join(GROUPS)}"
            )
        if o.key_or_group not in GROUPS:
            raise EvalError(f"{o.input_line}: {prog} takes the config groups {', '.join(GROUPS)}")
    places = [o.key_or_group.replace("/", ".") for o in chosen]
    fields = [o for o in parsed if o not in chosen]
    under = [o for o in fields if any(o.key_or_group.startswith(p + ".") for p in places)]
    cfg = OmegaConf.create(record)
    OmegaConf.set_struct(cfg, True)  # as dew-train's composed config: a plain key must be a field
    if chosen:
        composed = compose_config([str(o.input_line) for o in chosen + under], conf)
        with open_dict(cfg):
            for place in places:
                OmegaConf.update(cfg, place, OmegaConf.select(composed, place), merge=False)
    rest = [o for o in fields if o not in under]
    for o in rest:
        plain = not (o.is_add() or o.is_force_add() or o.is_delete())
        if plain and (problem := unset_record(o.key_or_group, cfg, Recipe, conf, o.get_value_element_as_str())):
            raise EvalError(problem)
    apply(rest, cfg)
    values = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(values, dict)
    return {str(k): v for k, v in values.items()}


def apply(parsed: Sequence[Override], cfg: Any) -> None:
    """Apply the field overrides ``parsed`` to ``cfg`` by Hydra's rules, or an EvalError with Hydra's
    reason in one line."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        compat.hydra_apply_overrides(list(parsed), cfg)
    except (HydraException, OmegaConfBaseException) as err:
        cause = f" ({' '.join(str(err.__cause__).split()[:12])})" if err.__cause__ else ""
        raise EvalError(" ".join(str(err).split()) + cause) from None


def compose_config(overrides: Sequence[str], conf: str) -> Any:
    """dew-train's composition of ``overrides`` (a ``DictConfig``), or an EvalError with Hydra's reason."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

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


def hf_architecture(directory: str) -> None:
    """Refuse, in one line, a Hugging Face directory that holds another model than dew reads, naming
    what it holds (``config.json``'s ``architectures`` and ``model_type``) and what dew reads."""
    try:
        with open(os.path.join(directory, HF_CONFIG)) as fh:
            config = json.load(fh)
    except (OSError, json.JSONDecodeError) as err:
        raise EvalError(f"{directory}/{HF_CONFIG}: cannot read it ({err})") from None
    held = (config.get("architectures") or []) if isinstance(config, dict) else []
    if set(HF_ARCHITECTURES) & set(held):
        return
    kind = config.get("model_type") if isinstance(config, dict) else None
    what = ", ".join(map(str, held)) or "no architecture named"
    raise EvalError(
        f"{directory} holds a {what} (model_type {kind!r}); dew reads Hugging Face directories of "
        f"{', '.join(HF_ARCHITECTURES)} and dew run directories (run.json)"
    )


def hf_recipe(directory: str, parsed: Sequence[Override], conf: str) -> Recipe:
    """dew-train's composition of the ``parsed`` overrides with the directory's model: its fields from
    ``config.json`` where the command line's ``model.config`` sets none (one it sets otherwise is
    refused by name), its parameters the directory's."""
    from omegaconf import OmegaConf

    hf_architecture(directory)
    composed = compose_config([str(o.input_line) for o in parsed], conf)
    values = OmegaConf.to_container(composed, resolve=True)
    assert isinstance(values, dict)
    model = values["model"]
    from dew.training.checkpointing.hf_config import ARCHITECTURE, with_checkpoint_fields  # reads config.json

    if model.get("architecture") != ARCHITECTURE:
        raise EvalError(
            f"{directory} holds a Hugging Face causal LM: evaluate it on token data "
            f"(data=token_windows data.path=... or data=text_stream ...); the command line composes a "
            f"{model.get('architecture')!r} model"
        )
    given = model.get("config") or {}
    model["config"] = json.loads(given) if isinstance(given, str) else given  # a JSON field, as composed
    values["trainer"]["init_from"] = directory
    values["trainer"]["name"] = os.path.basename(directory.rstrip("/")) or "hf"
    try:
        return with_checkpoint_fields(_typed({str(k): v for k, v in values.items()}))
    except (ConfigError, ValueError) as err:
        raise EvalError(" ".join(str(err).split())) from None
