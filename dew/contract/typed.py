"""Strict conversion between typed dataclass trees and JSON records.

``to_json`` writes a dataclass tree as plain JSON values (a registered member as its ``name`` and
its fields); ``from_json`` reads one back against the declared types and raises ``ConfigError``
naming the dotted path, what was expected and what was found. It checks what OmegaConf cannot hold
(``Literal``, unions of dataclasses, tuple lengths), so a config composed by Hydra goes through it
exactly once, at the boundary. ``differences`` lists where two such records differ (a resume
refused, ``dew-runs compare``, ``dew-sample`` against its run).
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, Union

from dew.contract.data import DataSpec, datasets
from dew.contract.schedules import ScheduleSpec, schedules

NAME_KEY = "name"
"""The key a registered member's kind is written under."""


class ConfigError(ValueError):
    """A record that does not fit its declared type, with the dotted path of the field at fault."""


class JsonString:
    """Marker in ``Annotated``: the field also accepts its value as one JSON string."""


def registry_of(cls: type) -> Mapping[str, type] | None:
    """The registry a base class dispatches through (``DataSpec`` -> datasets), or None."""
    if cls is DataSpec:
        return datasets
    if cls is ScheduleSpec:
        return schedules
    return None


def _describe(value: object) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(value).__name__} {text}"


def _type_name(tp: object) -> str:
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _type_name(typing.get_args(tp)[0])
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if tp is float:
        return "a finite float"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp)


def _fail(path: str, tp: object, value: object) -> typing.NoReturn:
    raise ConfigError(f"{path or '<root>'}: expected {_type_name(tp)}, found {_describe(value)}")


def hints(cls: type) -> dict[str, Any]:
    """Resolved type hints of a dataclass, ``Annotated`` metadata kept."""
    return typing.get_type_hints(cls, include_extras=True)


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


# What each scalar type accepts; bool is an int subclass, so it is neither an int nor a float here.
# A float field is finite: every float dew reads is a rate, a scale, a ratio or a size, where NaN or
# infinity cannot work (NaN also never equals itself, so a record holding one could never be resumed).
_SCALARS: dict[object, Callable[[object], bool]] = {
    type(None): lambda v: v is None,
    bool: lambda v: isinstance(v, bool),
    int: lambda v: isinstance(v, int) and not isinstance(v, bool),
    float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and _finite(v),
    str: lambda v: isinstance(v, str),
}


def from_json(tp: object, value: object, path: str = "") -> Any:
    """Read ``value`` as type ``tp``; raise ConfigError naming ``path`` if it does not fit."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        inner, *meta = typing.get_args(tp)
        if isinstance(value, str) and any(m is JsonString or isinstance(m, JsonString) for m in meta):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as err:
                raise ConfigError(
                    f"{path}: expected JSON ({_type_name(inner)}), found invalid JSON {value!r}: {err.msg}"
                ) from None
            value = with_defaults(inner, value)
        return from_json(inner, value, path)
    if tp is Any or tp is object:
        return value
    if origin is Literal:
        choices = typing.get_args(tp)
        # bool is an int subclass: compare types too, so True never matches 1.
        if any(value == c and type(value) is type(c) for c in choices):
            return value
        _fail(path, tp, value)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            _fail(path, tp, value)
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return from_json(arg, value, path)
            except ConfigError as err:
                errors.append(err)
        # One remaining alternative: its own message is the most precise one.
        if len(errors) == 1:
            raise errors[0]
        _fail(path, tp, value)
    if tp in _SCALARS:
        if not _SCALARS[tp](value):
            _fail(path, tp, value)
        if tp is float and isinstance(value, int):  # JSON's 1 where a float is expected: 1.0
            return float(value)
        return value
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            _fail(path, tp, value)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_json(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(f"{path}: expected {len(args)} items, found {len(value)}: {list(value)!r}")
        return tuple(from_json(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin in (dict, Mapping, typing.Mapping) or tp is dict:
        args = typing.get_args(tp) or (str, Any)
        if not isinstance(value, Mapping):
            _fail(path, tp, value)
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(f"{path}: keys must be strings, found {_describe(k)}")
            out[k] = from_json(args[1], v, f"{path}.{k}" if path else k)
        return out
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass_from_json(tp, value, path)
    raise TypeError(f"{path}: dew cannot read values of type {tp!r}")


def optional_of(tp: object) -> Any:
    """``X`` for ``X | None``; any other type as it is."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def with_defaults(tp: object, value: object) -> object:
    """``value`` with the records in it completed by their dataclass defaults.

    For a JSON string a user typed (``optim.param_groups='[{"pattern": "bias"}]'``), not for a
    record: a run record must carry every field, so ``from_json`` still refuses one that lacks any.
    The records inside are completed too: a dict's values, a record's fields, and a registered
    member named by its ``name`` (a mixture's components, ``{"web": {"data": {"name":
    "token_windows", "path": ...}}}``).
    """
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return with_defaults(typing.get_args(tp)[0], value)
    if origin is tuple and isinstance(value, list):
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return [with_defaults(args[0], v) for v in value]
        return [with_defaults(a, v) for a, v in zip(args, value)] + value[len(args) :]
    if origin is dict and isinstance(value, Mapping) and len(typing.get_args(tp)) == 2:
        return {k: with_defaults(typing.get_args(tp)[1], v) for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(value, Mapping):
        registry, kind = registry_of(tp), value.get(NAME_KEY)
        cls = tp if registry is None else registry.get(kind) if isinstance(kind, str) else None
        if cls is None:
            return value  # an unknown name: from_json names it
        types_, out = hints(cls), dict(value)
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            if f.name in out:
                out[f.name] = with_defaults(types_[f.name], out[f.name])
            elif f.default is not dataclasses.MISSING:
                out[f.name] = to_json(f.default)
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = to_json(f.default_factory())
        return out
    return value


def _dataclass_from_json(cls: type, value: object, path: str) -> Any:
    if not isinstance(value, Mapping):
        _fail(path, cls, value)
    registry = registry_of(cls)
    if registry is not None:
        kind = value.get(NAME_KEY)
        where = f"{path}.{NAME_KEY}" if path else NAME_KEY
        if not isinstance(kind, str) or kind not in registry:
            raise ConfigError(f"{where}: expected one of {', '.join(sorted(registry))}, found {_describe(kind)}")
        cls = registry[kind]
        value = {k: v for k, v in value.items() if k != NAME_KEY}
    field_types = hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        where = ", ".join(f"{path}.{k}" if path else k for k in unknown)
        raise ConfigError(
            f"{where}: unknown field{'s' if len(unknown) > 1 else ''} of "
            f"{cls.__name__}; its fields are {', '.join(fields)}"
        )
    missing = [k for k in fields if k not in value]
    if missing:
        where = ", ".join(f"{path}.{k}" if path else k for k in missing)
        raise ConfigError(f"{where}: missing field{'s' if len(missing) > 1 else ''} of {cls.__name__}")
    kwargs = {k: from_json(field_types[k], value[k], f"{path}.{k}" if path else k) for k in fields}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{path or cls.__name__}: {err}") from None


def to_json(value: object) -> Any:
    """Write a dataclass tree as JSON values; a registered member carries its ``name``."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        kind = getattr(type(value), NAME_KEY, None)
        if isinstance(kind, str) and registry_of(_registered_base(type(value))) is not None:
            out[NAME_KEY] = kind
        for f in dataclasses.fields(value):
            if f.init:
                out[f.name] = to_json(getattr(value, f.name))
        return out
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot write {_describe(value)} as JSON")


def _registered_base(cls: type) -> type:
    for base in cls.__mro__:
        if registry_of(base) is not None:
            return base
    return cls


def differences(old: object, new: object, prefix: str = "") -> list[str]:
    """Dotted paths where two JSON records differ, with both values."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in old or key not in new:
                out.append(f"{path}: {old.get(key, 'missing')!r} -> {new.get(key, 'missing')!r}")
            else:
                out.extend(differences(old[key], new[key], path))
        return out
    return [] if old == new else [f"{prefix}: {old!r} -> {new!r}"]
