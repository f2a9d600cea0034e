"""Hydra structured configs derived from dew's dataclasses: one source of truth.

OmegaConf 2.3 cannot hold ``Literal`` or unions of dataclasses, so each dataclass of the config
tree gets a twin that OmegaConf can: a ``Literal`` becomes its base type, a registered base class
(``DataSpec``, ``ScheduleSpec``) a node with a ``name`` and each registered member a subclass of it,
a tuple a list, a ``JsonDict`` ``Any`` (a JSON string or a dict). The twins type-check what OmegaConf
can while composing; ``RunConfig.from_dict`` then checks the rest (choices, tuple lengths, unknown
keys that ``+key=value`` slipped into a typed node) exactly once.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Annotated, Any, Literal, Optional, Union

from omegaconf import MISSING

from dew import compat
from dew.contract.typed import NAME_KEY, JsonString, hints, registry_of, to_json

# The twins below are classes made at run time: a submitit job's pickle copies them by value, and
# their fields' defaults must survive it (compat.dataclass_missing_pickles_as_itself says why).
compat.dataclass_missing_pickles_as_itself()


@functools.cache
def schema_of(cls: type) -> type:
    """The OmegaConf-compatible twin of dataclass ``cls`` (a registered base: the base node)."""
    if registry_of(cls) is not None:
        return dataclasses.make_dataclass(f"{cls.__name__}Node", [(NAME_KEY, str, MISSING)])
    return _twin(cls, bases=())


@functools.cache
def member_schema(cls: type[Any]) -> type:
    """The twin of a registered member (``Digits``), a subclass of its base node with its name."""
    base = next(b for b in cls.__mro__[1:] if registry_of(b) is not None)
    twin = _twin(cls, bases=(schema_of(base),), name_default=cls.name)  # every registered member has its name
    return twin


def _twin(cls: type, bases: tuple[type, ...], name_default: str | None = None) -> type:
    types_ = hints(cls)
    fields: list[
        tuple[str, Any, Any]
    ] = []  # (name, type, dataclasses.field(...)): the stubs type a field as its default
    if name_default is not None:
        fields.append((NAME_KEY, str, dataclasses.field(default=name_default)))
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = _node_type(types_[f.name])
        if tp is Any and _is_json(types_[f.name]):
            # A JSON field starts as the JSON text "{}", not as a dict node: Hydra merges a dict
            # override into a dict node in struct mode (new keys refused), but replaces a string,
            # so `model.config={depth: 4}` and `model.config='{"depth": 4}'` both work on the
            # default. Over a dict an option file set, `model.config.depth=4` changes a key and
            # `++model.config={...}` merges new ones.
            default = _default(f)
            if default.default_factory is not dataclasses.MISSING and default.default_factory() == {}:
                fields.append((f.name, tp, dataclasses.field(default="{}")))
            else:
                fields.append((f.name, tp, default))
            continue
        if f.default is None and _optional_record(types_[f.name]):
            # An unset optional record defaults to `${unset:}` (a resolver that gives null), not to
            # a plain null: OmegaConf 2.3 cannot merge a dict into a typed node that is null, so
            # `trainer.batch_ramp={start: 8, ...}` would fail; it expands an interpolation first.
            fields.append((f.name, tp, dataclasses.field(default=UNSET)))
            continue
        fields.append((f.name, tp, _default(f)))
    return dataclasses.make_dataclass(f"{cls.__name__}Node", fields, bases=bases)


UNSET = "${unset:}"
"""The default of an unset optional record; the ``unset`` resolver (``register_resolvers``) gives null."""


def register_resolvers() -> None:
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("unset", lambda: None, replace=True)


def _optional_record(tp: object) -> bool:
    if typing.get_origin(tp) not in (Union, types.UnionType):
        return False
    args = typing.get_args(tp)
    return type(None) in args and any(isinstance(a, type) and dataclasses.is_dataclass(a) for a in args)


def _is_json(tp: object) -> bool:
    return typing.get_origin(tp) is Annotated and any(
        isinstance(m, JsonString) or m is JsonString for m in typing.get_args(tp)[1:]
    )


def _default(f: dataclasses.Field[Any]) -> dataclasses.Field[Any]:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return dataclasses.field(default=MISSING)
    if dataclasses.is_dataclass(value) and registry_of(_base(type(value))) is not None:
        # A registered member's node types the field as that member, and another option of the
        # group could not merge over it: the field holds the base node and the group picks.
        return dataclasses.field(default_factory=schema_of(_base(type(value))))
    if dataclasses.is_dataclass(value):
        return dataclasses.field(default_factory=lambda: _to_node(value))
    plain = to_json(value)
    if isinstance(plain, (list, dict)):
        return dataclasses.field(default_factory=lambda: to_json(value))
    return dataclasses.field(default=plain)


def _to_node(value: object) -> Any:
    """A dataclass value as an instance of its twin (nested records as twins too)."""
    if dataclasses.is_dataclass(value):
        cls: type = type(value)
        node = member_schema(cls) if registry_of(_base(cls)) is not None else schema_of(cls)
        types_ = hints(cls)
        kwargs = {}
        for f in dataclasses.fields(value):
            if f.init:
                v = getattr(value, f.name)
                if _is_json(types_[f.name]) and v == {}:
                    kwargs[f.name] = "{}"
                elif v is None and _optional_record(types_[f.name]):
                    kwargs[f.name] = UNSET
                else:
                    kwargs[f.name] = _to_node(v)
        return node(**kwargs)
    if isinstance(value, (list, tuple)):
        return [_to_node(v) for v in value]
    return to_json(value)


def _base(cls: type) -> type:
    for b in cls.__mro__:
        if registry_of(b) is not None:
            return b
    return cls


def _node_type(tp: object) -> Any:
    origin = typing.get_origin(tp)
    if origin is Annotated:
        inner, *meta = typing.get_args(tp)
        if any(isinstance(m, JsonString) or m is JsonString for m in meta):
            return Any  # a JSON string or a dict; RunConfig.from_dict reads either
        return _node_type(inner)
    if origin is Literal:
        kinds = {type(a) for a in typing.get_args(tp)}
        return kinds.pop() if len(kinds) == 1 else Any
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        nodes = []
        for a in args:
            n = _node_type(a)
            if n not in nodes:
                nodes.append(n)
        if len(nodes) == 1:
            node = nodes[0]
        elif all(n in (int, float, str, bool) for n in nodes):
            node = Union[tuple(nodes)]  # noqa: UP007 - OmegaConf reads typing.Union
        else:
            node = Any
        return Optional[node] if optional else node  # noqa: UP045
    if origin is tuple:
        items = typing.get_args(tp)
        elem = items[0] if len(items) == 2 and items[1] is Ellipsis else Any
        return list[_node_type(elem)] if elem is not Any else list[Any]  # type: ignore[misc]  # a type built at run time, for OmegaConf
    if origin is dict:
        return dict[str, Any]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return schema_of(tp)
    return tp
