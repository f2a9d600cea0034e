"""JSON values on dew-train's command line, for the fields the spec writes as one JSON string.

The spec's ``JsonDict`` (``model.config``, ``optim.optimizer_opts``) and the JSON list of
``optim.param_groups`` are "written as a single JSON string on the command line":
``model.config='{"depth": 4}'``. The shell drops the quotes, and Hydra's override grammar reads
what is left as its own dict syntax, where a quoted key is a syntax error. So before Hydra parses
the command line, an override of one of these fields whose value is a JSON object or list is
quoted for Hydra (a quoted string), and ``RunConfig.from_dict`` reads the JSON. Hydra's own dict
syntax (``model.config={depth: 4}``) is not JSON and passes through unchanged.

One key of such a field is set with a dotted override, ``model.config.mup=true`` (or
``+model.config.mup=true``), whether or not the composed dict (or a run's record) already holds the
key: the field's keys are the architecture's (or the optimizer's), not the schema's, so the override
is given to Hydra as ``++`` (add or override), and the typed conversion names a key the field does
not take.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from collections.abc import Sequence
from typing import Annotated

from dew.contract.typed import JsonString, hints, registry_of


def json_fields(cls: type, prefix: str = "") -> set[str]:
    """Dotted paths of the fields of dataclass ``cls`` (and the records under it) that take a JSON
    string."""
    out: set[str] = set()
    for name, tp in hints(cls).items():
        path = f"{prefix}{name}"
        if typing.get_origin(tp) is Annotated and any(
            m is JsonString or isinstance(m, JsonString) for m in typing.get_args(tp)[1:]
        ):
            out.add(path)
            continue
        args = [a for a in (typing.get_args(tp) or (tp,)) if a is not type(None)]
        for arg in args:
            if isinstance(arg, type) and dataclasses.is_dataclass(arg) and registry_of(arg) is None:
                out |= json_fields(arg, f"{path}.")
    return out


_OVERRIDE = re.compile(r"^(?P<prefix>\+{0,2})(?P<key>[A-Za-z_][\w.]*)=(?P<value>.*)$", re.DOTALL)


def quote_json_overrides(args: Sequence[str], fields: set[str]) -> list[str]:
    """``args`` with each override of a field in ``fields`` whose value is a JSON object or list
    written as a Hydra quoted string (``key='<json>'``); every other argument as it was."""
    out = []
    for arg in args:
        match = _OVERRIDE.match(arg)
        if match and match["key"] in fields and _is_json_record(match["value"]):
            out.append(f"{match['prefix']}{match['key']}={_hydra_quoted(match['value'])}")
        else:
            out.append(arg)
    return out


def _is_json_record(value: str) -> bool:
    if not value.lstrip().startswith(("{", "[")):
        return False
    try:
        return isinstance(json.loads(value), (dict, list))
    except json.JSONDecodeError:
        return False


def _hydra_quoted(value: str) -> str:
    """``value`` in Hydra's single quotes: a backslash before a quote (or at the end) doubled, then
    each quote escaped (Hydra's override grammar, "Quoted values")."""
    value = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value)
    return "'" + value.replace("'", "\\'") + "'"


def set_json_keys(args: Sequence[str], fields: set[str]) -> list[str]:
    """``args`` with each plain or ``+`` override of one key inside a field of ``fields``
    (``model.config.mup=true``, ``+model.config.mup=true``) written as Hydra's add-or-override
    (``++model.config.mup=true``): whether an option, or a run's record, already holds the key is
    not the user's to know; every other argument as it was."""
    out = []
    for arg in args:
        match = _OVERRIDE.match(arg)
        if match and match["prefix"] != "++" and any(match["key"].startswith(f"{f}.") for f in fields):
            out.append(f"++{match['key']}={match['value']}")
        else:
            out.append(arg)
    return out
