"""Hydra's composition errors as one line: the field or the config group, the value given, and what
is allowed (``trainer.batch_size='abc': not an integer``; ``optim=sgd: no such option in group
optim; the options are adam, adamw, ...``).

Hydra reports a value it cannot merge into its typed field, an option a config group does not
have, or a key no node holds in five to twelve lines (its message, OmegaConf's with the node's
reference and object types, the config search path) and exits 1. ``dew-train`` hands each such
error here (``dew.compat.hydra_reports``) and ends with the line and exit status 2 instead, for a
single run, ``--check`` and every job of a sweep alike: Hydra composes each job of a sweep before
the first starts. Anything else is not a bad input and is left to Hydra.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from dew.contract.typed import NAME_KEY

_KINDS = {
    "could not be converted to Integer": "not an integer",
    "could not be converted to Float": "not a number",
    "is not a valid bool": "not a boolean (true or false)",
    "is not Optional": "cannot be null",
    "Cannot merge DictConfig with ListConfig": "expected a mapping ('{key: value}'), found a list",
    "Cannot merge ListConfig with DictConfig": "expected a list ('[a, b]'), found a mapping",
}
"""OmegaConf's reason for refusing a value, in dew's words, by a phrase of its message."""


def composition_error(err: BaseException, roots: Sequence[Path]) -> str | None:
    """One line for an error Hydra raised composing the config from the command line, None for any
    other error. ``roots``: the directories of config groups (dew's conf/, its plugins', launch/),
    where the options of a group are listed from."""
    if isinstance(err, MissingConfigException):
        return _missing_option(err, roots)
    if isinstance(err, ConfigCompositionException) and isinstance(err.__cause__, OmegaConfBaseException):
        cause = err.__cause__
        if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and cause.full_key:
            return _unknown_key(cause, roots)
        merging = re.match(r"Error merging override (\S+?)=(.*)", str(err))
        if merging:
            return _bad_value(merging.group(1), merging.group(2), cause, roots)
    if isinstance(err, (HydraException, OmegaConfBaseException)):
        return _first_line(err) + (f": {_first_line(err.__cause__)}" if err.__cause__ is not None else "")
    return None


def _missing_option(err: MissingConfigException, roots: Sequence[Path]) -> str:
    """``optim=sgd``: the group's options (Hydra's list, or the group's files where it gives none)."""
    missing = err.missing_cfg_file or ""
    group, _, option = missing.rpartition("/")
    if not group:
        return _first_line(err)
    options = sorted(err.options or group_options(group, roots))
    where = re.match(r"In '([^']+)'", str(err))
    chosen = f" (chosen in {where.group(1)}.yaml)" if where and where.group(1) != "config" else ""
    allowed = f"the options are {', '.join(options)}" if options else "the group has no options"
    return f"{group}={option}{chosen}: no such option in group {group}; {allowed}"


def _unknown_key(cause: OmegaConfBaseException, roots: Sequence[Path]) -> str:
    """``trainer.nope``: the fields of the record it was given to (a top-level key: the groups too)."""
    key = str(cause.full_key)
    parent, _, _ = key.rpartition(".")
    fields = _fields(cause.object_type)
    if not parent:
        groups = sorted({p.name for root in roots if root.is_dir() for p in root.iterdir() if _is_group(p)})
        return (
            f"{key}: neither a config group nor a field of the run; the groups are {', '.join(groups)}, "
            f"the fields {', '.join(fields)}"
        )
    if not fields and isinstance(keys := getattr(cause, "parent_node", None), Mapping):
        # A free-form mapping an option file set (an experiment's model.config): struct, so Hydra
        # adds no key to it unless asked to.
        leaf = key.rpartition(".")[2]
        return (
            f"{key}: not a key of {parent} as composed (its keys are {', '.join(map(str, keys))}); "
            f"add one with ++{parent}={{{leaf}: ...}} or +{key}=..."
        )
    record = _record_name(cause.object_type)
    return f"{key}: unknown field of {parent}{f' ({record})' if record else ''}; its fields are {', '.join(fields)}"


def _bad_value(key: str, text: str, cause: OmegaConfBaseException, roots: Sequence[Path]) -> str:
    """``trainer.batch_size='abc'``: why the value cannot go into the field, and what can."""
    value = cause.value
    if cause.full_key and cause.full_key != key:  # a value inside a mapping (trainer.mesh={data: x})
        key, text = str(cause.full_key), str(value)
    shown = f"{key}={text!r}" if isinstance(value, str) else f"{key}={text}"
    message = str(cause)
    if "converted to Integer" in message and isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return f"{shown}: not an integer; write {key}={int(value)}"
    if record := re.search(r"is not a subclass of (\w+)Node", message):
        group = key.replace(".", "/")
        options = group_options(group, roots)
        fields = _fields_of_node(cause, key)
        if options:
            how = f"; choose one of its options with {group}=... ({', '.join(options)})"
        elif fields:
            how = f"; set its fields one by one ({key}.{fields[0]}=...; its fields are {', '.join(fields)})"
        else:
            how = ""
        return f"{shown}: {key} is a record ({record.group(1)}), not a value{how}"
    reason = next((words for phrase, words in _KINDS.items() if phrase in message), None)
    return f"{shown}: {reason or _first_line(cause)}"


def _fields_of_node(cause: OmegaConfBaseException, key: str) -> list[str]:
    """The fields of the record at ``key``, from the typed node that holds it."""
    holder = cause.object_type
    if holder is None or not dataclasses.is_dataclass(holder):
        return []
    field = next((f for f in dataclasses.fields(holder) if f.name == key.rpartition(".")[2]), None)
    node = field.type if field is not None else None
    return _fields(node) if isinstance(node, type) else []


def group_options(group: str, roots: Sequence[Path]) -> list[str]:
    """The options of config group ``group`` (``optim/schedule``): its YAML files under ``roots``."""
    return sorted({f.stem for root in roots for f in (root / group).glob("*.yaml")})


def _is_group(path: Path) -> bool:
    return path.is_dir() and path.name != "hydra" and any(path.glob("*.yaml"))


def _fields(node: object) -> list[str]:
    """The fields of a typed node (the dataclass twin of a dew record), the kind's name left out."""
    if not (isinstance(node, type) and dataclasses.is_dataclass(node)):
        return []
    return [f.name for f in dataclasses.fields(node) if f.name != NAME_KEY]


def _record_name(node: object) -> str:
    return node.__name__.removesuffix("Node") if isinstance(node, type) else ""


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
