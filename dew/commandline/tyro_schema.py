"""The typed run as a tyro command line: the API contract's "recipes parse it with tyro".

``parse`` reads a ``RunConfig`` (``Recipe``, or a recipe's own subclass) from the command line with
tyro and converts it with ``from_dict``, the strict reader ``dew-train`` converts Hydra's composed
config with: tyro only collects the values, as the JSON record ``to_dict`` writes, so both front ends
build the same run from the same values and refuse a bad one with the same message.

How the types become a command line (``_ARGS``, a tyro constructor registry):

- every field is an option named by its dotted path, ``--trainer.batch-size 8``;
- a registered part is a subcommand, one per registry entry, so a plugin's appears too: the dataset
  (``data:token-windows --data.path ...``, the contract's example) and the learning-rate schedule
  (``optim.schedule:cosine``, or ``optim.schedule:none``);
- an optional record (``lora``, ``trainer.wandb``, ``trainer.batch-ramp``, ...) is ``lora:on`` with
  its fields, or ``lora:none`` (the default where the dataclass leaves it unset);
- the model's and the optimizer's own options are one JSON object (``--model.config '{"depth": 4}'``:
  the contract's opaque ``JsonDict``), a list of records one JSON list (``--optim.param-groups``,
  ``--trainer.hooks``), each record completed by its defaults;
- the architecture and the objective are choices from their registries;
- a subcommand's options follow it, the others may come before or after any subcommand (tyro's
  ``CascadeSubcommandArgs``).

A bad command line ends with one line naming the option and what it takes, and exit status 2.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, NoReturn, Union

import tyro
from tyro.constructors import (
    ConstructorRegistry,
    PrimitiveConstructorSpec,
    StructConstructorSpec,
    StructFieldSpec,
    StructTypeInfo,
)

from dew.compat import tyro_parse_errors
from dew.contract.config import ModelConfig, RunConfig
from dew.contract.models import architectures
from dew.contract.objectives import objectives
from dew.contract.typed import NAME_KEY, ConfigError, JsonString, registry_of, to_json, with_defaults

EXIT_BAD_INPUT = 2
"""The command line or the values in it are wrong; nothing was written (``dew-train``'s status too)."""

UNSET = "none"
"""The subcommand of an unset optional record or schedule."""
SET = "on"
"""The subcommand that sets an optional record."""


class BadCommandLine(Exception):
    """The one line a bad command line ends with."""


def parse[C: RunConfig](
    cls: type[C],
    args: Sequence[str] | None = None,
    *,
    default: C | None = None,
    prog: str = "dew-recipe",
    description: str | None = None,
) -> C:
    """The run ``args`` (``sys.argv[1:]`` when None) describe, as ``cls``, starting from ``default``
    (``cls()`` when None). A bad command line, or values ``cls.from_dict`` refuses, print one line,
    ``<prog>: error: ...``, and exit with status 2; ``--help`` prints the options and exits 0."""
    try:
        with tyro_parse_errors(_refuse):
            record = tyro.cli(
                cls,
                args=list(sys.argv[1:] if args is None else args),
                default=default if default is not None else tyro.MISSING_NONPROP,
                prog=prog,
                description=description,
                config=(tyro.conf.CascadeSubcommandArgs,),
                registry=_ARGS,
            )
        return cls.from_dict(typing.cast(dict[str, Any], record))
    except (BadCommandLine, ConfigError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_BAD_INPUT) from None


def _refuse(line: str) -> NoReturn:
    raise BadCommandLine(line)


# --- the rules: how each field of the run becomes options ------------------------------------------

_ARGS = ConstructorRegistry()
_inside_rule = False


@_ARGS.struct_rule
def _record(info: StructTypeInfo) -> StructConstructorSpec | None:
    """A dataclass of the run: tyro's own fields for it (names, defaults, help from the docstrings),
    each field's type made its command line (``_cli_type``), and instantiated as its JSON record."""
    global _inside_rule
    cls = info.type
    if _inside_rule or not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return None
    _inside_rule = True
    try:
        spec = ConstructorRegistry.get_struct_spec(info)  # tyro's dataclass rule: this one steps aside
    finally:
        _inside_rule = False
    if not isinstance(spec, StructConstructorSpec):
        return None  # a default that does not fit: tyro's own rule says so
    fields = tuple(_field(cls, f) for f in spec.fields)
    kind = getattr(cls, NAME_KEY, None) if any(registry_of(base) is not None for base in cls.__mro__) else None

    def record(**values: object) -> dict[str, object]:
        # A default tyro hands on whole (an unchanged record) is still a dataclass: written as JSON.
        written = {name: to_json(value) for name, value in values.items()}
        return {NAME_KEY: kind, **written} if isinstance(kind, str) else written

    return StructConstructorSpec(instantiate=record, fields=fields)


def _field(cls: type, field: StructFieldSpec) -> StructFieldSpec:
    tp: Any = field.type
    if issubclass(cls, ModelConfig) and field.name == "architecture":
        tp = Literal[tuple(sorted(architectures))]  # sorted: registration order follows import order
    elif issubclass(cls, RunConfig) and field.name == "objective":
        tp = Literal[tuple(sorted(objectives))] | None
    return dataclasses.replace(field, type=_cli_type(tp, field.default), helptext=_plain_help(field.helptext))


def _cli_type(tp: Any, default: object) -> Any:
    """The type tyro parses for a field of type ``tp`` whose default is ``default``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        inner, *meta = args
        if any(m is JsonString or isinstance(m, JsonString) for m in meta):
            return Annotated[inner, _json_argument(inner)]
        return Annotated[(_cli_type(inner, default), *meta)]
    if origin in (Union, types.UnionType):
        present = [a for a in args if a is not type(None)]
        if len(present) == 1 and _is_record(present[0]):
            return _subcommands(present[0], default, optional=type(None) in args)
        return tp
    if registry_of(tp) is not None:
        return _subcommands(tp, default, optional=False)
    if origin is tuple and args and _is_record(args[0]):  # records in a list: trainer.hooks
        return Annotated[tp, _json_argument(tp)]
    if origin is dict and len(args) == 2 and (args[1] is Any or _is_record(args[1])):
        return Annotated[tp, _json_argument(tp)]  # an open dict (a hook's options), records by name (components)
    return tp


def _is_record(tp: object) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _subcommands(base: type, default: object, *, optional: bool) -> Any:
    """One subcommand per registered member of ``base`` (``data:digits``, ...), or ``on`` for an
    optional record that is no registry's, and ``none`` where the field may be unset. Registry names
    take hyphens, as tyro writes every name (``data:token-windows``), and their own spelling too."""
    registry = registry_of(base)
    members = dict(registry.items()) if registry is not None else {SET: base}
    options = []
    for name, member in members.items():
        chosen = default if isinstance(default, member) else _default_of(member)
        aliases = (name,) if "_" in name else ()
        subcommand = tyro.conf.subcommand(
            name.replace("_", "-"),
            default=tyro.MISSING_NONPROP if chosen is None else chosen,
            description=_summary(member),
            aliases=aliases,
        )
        options.append(Annotated[member, subcommand])
    if optional:
        options.append(Annotated[None, tyro.conf.subcommand(UNSET, description="Unset.")])
    return Union[tuple(options)]  # noqa: UP007 (a union built from a tuple of types)


def _summary(cls: type) -> str:
    """The first paragraph of a class's docstring, for its subcommand's line in the help."""
    return _plain((cls.__doc__ or "").split("\n\n")[0]) or cls.__name__


def _default_of(member: type) -> object | None:
    """``member()`` when its fields all have defaults that pass its checks, else None (the
    subcommand then asks for the fields it needs: ``trainer.wandb:on --trainer.wandb.project p``)."""
    try:
        return member()
    except (TypeError, ValueError):
        return None


def _json_argument(tp: Any) -> PrimitiveConstructorSpec:
    """One argument holding a JSON value of type ``tp`` (``from_dict`` checks it); a record in it
    is completed by its defaults, as dew-train completes one."""

    def read(words: list[str]) -> object:
        try:
            value = json.loads(words[0])
        except json.JSONDecodeError as err:
            raise ValueError(f"expected JSON, found {words[0]!r}: {err.msg}") from None
        return with_defaults(tp, value)

    return PrimitiveConstructorSpec(
        nargs=1,
        metavar="JSON",
        instance_from_str=read,
        is_instance=lambda value: True,
        str_from_instance=lambda value: [json.dumps(to_json(value))],
    )


def _plain(text: str) -> str:
    """A docstring as one paragraph for the help's columns, ``code`` in single backticks."""
    return re.sub(r"\s+", " ", text).replace("``", "`").strip()


def _plain_help(helptext: str | Callable[[], str | None] | None) -> str | Callable[[], str | None] | None:
    if callable(helptext):
        return lambda: _plain_help(helptext())  # type: ignore[return-value]
    return _plain(helptext) if helptext else helptext
