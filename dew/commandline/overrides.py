"""The command line's overrides, read the one way every dew command reads them (``dew-train``,
``dew-eval``, ``dew-sample``, ``dew-export``): ``hydra_form`` rewrites what dew adds to Hydra's
grammar (a JSON object or list for a JSON field, a key inside one: ``dew.commandline.json_args``), and
``parse_overrides`` parses them with Hydra's own parser after ``check_overrides``. dew-train hands the
result to Hydra; the inference commands apply it to a run's record with Hydra's own rules.

``check_overrides`` answers the two mistakes Hydra reports
without naming what is allowed: a key the config does not have (``trainer.nope=1``: Hydra says the
key is not in the node, not which keys are) and a value its grammar cannot parse
(``model.config='{depth: '``: Hydra says where its parser stopped, not which field it was reading).

Only what the typed config tree decides is judged here; a key under a free-form field (``Any``, a
JSON dict) or under a registered record whose member the command line chooses (``data``,
``optim.schedule``) is left to Hydra and to the strict conversion, which name it themselves.

Also the command lines that print instead of training, rewritten before Hydra reads them
(``first_job_to_print``: ``-m`` with ``--cfg``; ``hydra_help_args``: ``--hydra-help``).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Union

from dew.commandline.json_args import json_fields, quote_json_overrides, set_json_keys
from dew.compat import hydra_args_parser
from dew.contract.typed import hints, registry_of

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override
    from omegaconf import DictConfig


def _record_type(tp: object) -> type | None:
    """The dataclass behind ``tp`` (through ``Annotated`` and ``X | None``), else None."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _record_type(typing.get_args(tp)[0])
    if origin in (Union, types.UnionType):
        records = [a for a in typing.get_args(tp) if a is not type(None)]
        return _record_type(records[0]) if len(records) == 1 else None
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def unknown_key(key: str, root: type) -> str | None:
    """A message naming the dotted ``key`` and the fields allowed where it goes wrong, or None when
    the typed tree has it (or does not decide it)."""
    parts = key.split(".")
    if len(parts) < 2 or parts[0] == "hydra":
        return None  # a config group (model=...), a top-level field, or Hydra's own settings
    tp: object = root
    for depth, part in enumerate(parts):
        cls = _record_type(tp)
        if cls is None or registry_of(cls) is not None:
            return None
        fields = [f.name for f in dataclasses.fields(cls) if f.init]
        if part not in fields:
            where = ".".join(parts[:depth])
            return (
                f"{'.'.join(parts[: depth + 1])}: unknown field of {where or 'the run'} ({cls.__name__}); "
                f"its fields are {', '.join(fields)}"
            )
        tp = hints(cls)[part]
    return None


def check_overrides(overrides: Sequence[str], root: type) -> str | None:
    """The first problem with the command line's ``key=value`` overrides, as one message, or None."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for text in overrides:
        try:
            override = parser.parse_override(text)
        except HydraException as err:
            key, _, value = text.partition("=")
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            return (
                f"{key.lstrip('+~')}: cannot parse the value {value!r} ({first}). Quote a value with "
                "spaces, braces or brackets for the shell, e.g. model.config='{depth: 4}'; see "
                "https://hydra.cc/docs/advanced/override_grammar/basic/"
            )
        if override.is_add() or override.is_force_add() or override.is_delete() or override.package:
            continue  # +key and ++key are checked by the strict conversion, ~key by Hydra
        if problem := unknown_key(override.key_or_group, root):
            return problem
    return None


def hydra_form(args: Sequence[str], root: type) -> list[str]:
    """``args`` as dew gives them to Hydra: an override of a JSON field of ``root`` whose value is a
    JSON object or list quoted (``model.config='{"depth": 4}'``), a key inside such a field set
    whether or not the field holds it (``model.config.depth=4``, ``+model.config.depth=4``: ``++``);
    every other argument as it was."""
    fields = json_fields(root)
    return set_json_keys(quote_json_overrides(args, fields), fields)


def add_override_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments dew-eval, dew-sample and dew-export take after the run: dew-train's overrides
    of the run's record, and ``--cfg`` to print the result."""
    p.add_argument(
        "overrides",
        nargs="*",
        help="dew-train's overrides of the run's record: key=value, +key=value, ~key, group=option",
    )
    p.add_argument(
        "--cfg",
        action="store_true",
        help="print the run's config with the overrides applied (YAML, as dew-train --cfg job prints one) and exit",
    )


def not_overrides(overrides: Sequence[str]) -> str | None:
    """A message for the first of a command's positional ``overrides`` that is no override, or None
    (an inference command's argument parser reads them before anything is parsed as Hydra would)."""
    bad = [o for o in overrides if "=" not in o and not o.startswith("~")]
    return f"{bad[0]!r} is not an override (key=value, +key=value, ~key or group=option)" if bad else None


def parse_overrides(overrides: Sequence[str], root: type) -> list[Override]:
    """``overrides`` (in ``hydra_form``) parsed by Hydra's parser, or a ValueError with
    ``check_overrides``' one line (a value it cannot parse, a key ``root`` does not have)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if problem := check_overrides(overrides, root):
        raise ValueError(problem)
    return OverridesParser.create().parse_overrides(list(overrides))


# ------------------------------------------------------------------- overrides into unset records


def nullable_record(key: str, root: type) -> tuple[str, type] | None:
    """(path, record class) of the optional record (``X | None``, such as ``optim.schedule`` or
    ``trainer.wandb``) that the dotted ``key`` sets a field inside, or None."""
    parts = key.split(".")
    cls = root
    for depth, part in enumerate(parts[:-1]):
        record = _record_type(cls)
        if record is None or part not in hints(record):
            return None
        tp = hints(record)[part]
        base = typing.get_args(tp)[0] if typing.get_origin(tp) is Annotated else tp
        if typing.get_origin(base) in (Union, types.UnionType) and type(None) in typing.get_args(base):
            inner = _record_type(base)
            if inner is not None:
                return ".".join(parts[: depth + 1]), inner
        cls = tp
    return None


def how_to_set(path: str, record: type, conf: str | None, example: str = "...") -> str:
    """How a user gives the unset record at ``path``: choose one of its config group's options, or
    write it whole (``example``: the user's own ``field: value``), naming its fields."""
    group = path.replace(".", "/")
    if conf is not None and (options := sorted(p.stem for p in Path(conf, group).glob("*.yaml"))):
        return f"choose one first, e.g. {group}={options[0]} (options: {', '.join(options)}), then set its fields"
    parent, _, option = group.rpartition("/")
    if conf is not None and parent and Path(conf, parent, f"{option}.yaml").is_file():
        # One option of a group that takes several (trainer/trackers=[tensorboard,csv]).
        options = sorted(p.stem for p in Path(conf, parent).glob("*.yaml"))
        return (
            f"choose it first, e.g. {parent}={option} (options: {', '.join(options)}; several as "
            f"{parent}=[{','.join(options[:2])}]), then set its fields"
        )
    members = registry_of(record)
    if members is not None:
        return f"choose one first, e.g. {path}='{{kind: {next(iter(members))}}}' (kinds: {', '.join(members)})"
    fields = [f.name for f in dataclasses.fields(record) if f.init]
    return f"give the record whole, e.g. {path}='{{{example}}}' (its fields: {', '.join(fields)})"


def unset_record(key: str, cfg: DictConfig, root: type, conf: str | None = None, value: str = "...") -> str | None:
    """A message when ``key`` (set to ``value``) sets a field of an optional record the composed
    ``cfg`` leaves unset (null), so Hydra has nowhere to put it; None otherwise."""
    from omegaconf import OmegaConf

    found = nullable_record(key, root)
    if found is None:
        return None
    path, record = found
    if OmegaConf.select(cfg, path, default="<absent>") is not None:
        return None
    example = f"{key[len(path) + 1 :].replace('.', ': {')}: {value}" + "}" * key[len(path) + 1 :].count(".")
    return (
        f"{key}: {path} is unset in this run (null), so it has no field to set; "
        f"{how_to_set(path, record, conf, example)}"
    )


def check_unset_records(overrides: Sequence[str], root: type, conf: str) -> str | None:
    """The first command-line override into an unset optional record (``optim.schedule.warmup_steps=15``
    when no schedule is chosen), as one message, or None. Hydra would stop on it with an OmegaConf
    assertion. Composes the config once, without those overrides (and with each sweep's first value),
    only when the command line has one; any other problem is left to Hydra to report."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return None
    plain = [o for o in parsed if not (o.is_add() or o.is_force_add() or o.is_delete() or o.package)]
    suspects = [
        o for o in plain if (found := nullable_record(o.key_or_group, root)) and not _chosen(found[0], parsed, conf)
    ]
    if not suspects:
        return None
    rest = [text for o in parsed if o not in suspects and (text := _one_value(o)) is not None]
    try:
        with initialize_config_dir(config_dir=conf, version_base="1.3"):
            cfg = compose(config_name="config", overrides=rest)
    except Exception:
        return None
    return next(
        (p for o in suspects if (p := unset_record(o.key_or_group, cfg, root, conf, o.get_value_element_as_str()))),
        None,
    )


def _chosen(path: str, parsed: Sequence[Override], conf: str) -> bool:
    """Whether the command line, or the experiment file it names, plainly gives the record at
    ``path`` (its config group chosen, or the record set): then no composition is needed to know it
    is set, which spares most commands (``experiment=digits optim.schedule.warmup_steps=1``) a second
    composition. Anything less plain is left to the composition."""
    from omegaconf import DictConfig, OmegaConf

    group = path.replace(".", "/")
    for o in parsed:
        key = o.key_or_group
        if key == path or key.split("@")[0] == group:
            return True
        if key == "experiment" and not o.is_sweep_override():
            file = Path(conf, "experiment", f"{o.get_value_element_as_str()}.yaml")
            if not file.is_file():
                continue
            experiment = OmegaConf.load(file)
            if not isinstance(experiment, DictConfig):
                continue
            entries = [e for e in experiment.get("defaults", []) if isinstance(e, DictConfig)]
            if any(group in str(k).split("@")[0] and v is not None for e in entries for k, v in e.items()):
                return True
            if isinstance(OmegaConf.select(experiment, path), DictConfig):
                return True
    return False


def _one_value(override: Override) -> str | None:
    """``override`` as text, a sweep replaced by its first value (None for a sweep with no list)."""
    if not override.is_sweep_override():
        return override.input_line
    try:
        first = next(iter(override.sweep_string_iterator()))
    except Exception:
        return None
    return f"{override.get_key_element()}={first}"


MULTIRUN_FLAGS = ("-m", "--multirun")
PRINT_FLAGS = ("--cfg", "-c", "--info", "-i")


def first_job_to_print(argv: Sequence[str]) -> tuple[list[str], str | None]:
    """``-m`` with ``--cfg`` or ``--info``, which Hydra refuses together (with a traceback), as the
    command line that prints the config of the sweep's first job, composed as the sweep composes it
    (``hydra.mode=MULTIRUN``: the sweep's launcher, sweeper and directories under ``--cfg hydra``),
    each swept value replaced by its first; and a note saying which job that is (None without a
    sweep). Any other command line comes back as it is. Raises ValueError for a value the sweeper
    samples (``interval(...)``): no job's config is known before the sweep runs."""
    flags = {a.split("=")[0] for a in argv if a.startswith("-")}
    if not (flags & set(MULTIRUN_FLAGS) and flags & set(PRINT_FLAGS)):
        return list(argv), None
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    rest = [a for a in argv if a not in MULTIRUN_FLAGS]
    try:
        overrides = hydra_args_parser().parse_known_args(rest)[0].overrides
        parsed = OverridesParser.create().parse_overrides(overrides)
    except (SystemExit, HydraException):
        return rest, None  # Hydra reports its own usage and grammar errors
    first: dict[str, str] = {}
    for o in (o for o in parsed if o.is_sweep_override()):
        if (value := _one_value(o)) is None:
            raise ValueError(
                f"{o.input_line}: the sweeper samples this value, so no job's config is known "
                "before the sweep runs; give it one value to print a config with --cfg"
            )
        assert o.input_line is not None  # parse_overrides keeps each override's text
        first[o.input_line] = value
    out = with_overrides([first.get(a, a) for a in rest], ["hydra.mode=MULTIRUN"])
    note = f"the config of the sweep's first job ({' '.join(first.values())})" if first else None
    return out, note


def with_overrides(argv: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``argv`` with the overrides ``extra`` put before its first override, or at its end when it has
    none: Hydra's parser reads the overrides as one run of arguments, not two."""
    try:
        overrides = hydra_args_parser().parse_known_args(list(argv))[0].overrides
    except SystemExit:
        overrides = []
    at = next((i for i, a in enumerate(argv) if a in overrides), len(argv))
    return [*argv[:at], *extra, *argv[at:]]


def hydra_help_args(argv: Sequence[str], launch_uri: str) -> list[str]:
    """``--hydra-help``'s command line as dew shows it: Hydra composes that help from its own config
    alone (not conf/config.yaml), so dew's template (``hydra/hydra_help=dew``) and the launcher
    profiles' directory are named here, and the overrides of dew's own config (``experiment=digits``),
    which Hydra's config alone would refuse, are left out: they change nothing in Hydra's help."""
    try:
        overrides = set(hydra_args_parser().parse_known_args(list(argv))[0].overrides)
    except SystemExit:
        return list(argv)  # Hydra reports its own usage errors
    own = [a for a in argv if a not in overrides or a.lstrip("+~").startswith(("hydra/", "hydra."))]
    extra = [] if any(a.startswith("hydra/hydra_help=") for a in own) else ["hydra/hydra_help=dew"]
    return with_overrides(own, [*extra, f"hydra.searchpath=[{launch_uri}]"])
