"""The command line's overrides, read before Hydra composes them, for the two mistakes Hydra reports
without naming what is allowed: a key the config does not have (``trainer.nope=1``: Hydra says the
key is not in the node, not which keys are) and a value its grammar cannot parse
(``model.config='{depth: '``: Hydra says where its parser stopped, not which field it was reading).

Only what the typed config tree decides is judged here; a key under a free-form field (``Any``, a
JSON dict) or under a registered record whose member the command line chooses (``data``,
``optim.schedule``) is left to Hydra and to the strict conversion, which name it themselves.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Sequence
from typing import Annotated, Any, Union

from dew.typed import hints, registry_of


def _record_type(tp: Any) -> Any:
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
    cls = root
    for depth, part in enumerate(parts):
        cls = _record_type(cls)
        if cls is None or registry_of(cls) is not None:
            return None
        fields = [f.name for f in dataclasses.fields(cls) if f.init]
        if part not in fields:
            where = ".".join(parts[:depth])
            return (f"{'.'.join(parts[:depth + 1])}: unknown field of {where or 'the run'} ({cls.__name__}); "
                    f"its fields are {', '.join(fields)}")
        cls = hints(cls)[part]
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
            return (f"{key.lstrip('+~')}: cannot parse the value {value!r} ({first}). Quote a value with "
                    "spaces, braces or brackets for the shell, e.g. model.config='{depth: 4}'; see "
                    "https://hydra.cc/docs/advanced/override_grammar/basic/")
        if override.is_add() or override.is_force_add() or override.is_delete() or override.package:
            continue  # +key and ++key are checked by the strict conversion, ~key by Hydra
        if problem := unknown_key(override.key_or_group, root):
            return problem
    return None
