"""The ``config.json`` of a Hugging Face causal LM as dew's ``transformer`` reads and writes it, for
the four families whose blocks are dew's (``FAMILIES``): Llama, Qwen2 (Qwen2.5), Qwen3 and Mistral.
They are one decoder (pre-norm RMSNorm, rotary embeddings on (first half, second half) pairs,
grouped-query attention, SwiGLU) with one difference each, a field of dew's transformer:

- ``Qwen2ForCausalLM``: biases on the query, key and value projections (``qkv_bias``);
- ``Qwen3ForCausalLM``: an RMSNorm over each query and key head before the rotation (``qk_norm``);
- ``MistralForCausalLM``: a sliding attention window (``sliding_window``, or none).

No JAX here: ``with_checkpoint_fields`` fills a run's ``model.config`` from the directory its
``trainer.init_from`` names on a login node, in the launcher's checks and in ``dew-plan``.

``config.json`` comes in two spellings: transformers 4 writes ``rope_theta`` and ``rope_scaling``
at the top level, transformers 5 one ``rope_parameters`` object (``{rope_theta, rope_type, ...}``);
``rope_of`` reads both, and ``config_json`` writes both, so old and new readers load what dew
writes. What a directory may hold and dew does not compute (an output-projection or MLP bias, a
window on some layers only, another activation, a RoPE dynamic in the sequence length, quantized
weights) is refused naming the field (``refuse_unmodelled``), never ignored.

**Hub names.** ``trainer.init_from`` (and ``dew-eval``'s directory) may name a model as the hub
does (``Qwen/Qwen2.5-0.5B``): it is read from the local Hugging Face cache with the hub offline
(``local_directory``), as ``data=hf_text`` reads a hub dataset; nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dew.contract.config import hub_name
from dew.contract.typed import ConfigError
from dew.models.rope_scaling import RopeScaling
from dew.models.transformer import Transformer

if TYPE_CHECKING:
    from dew.contract.config import RunConfig
    from dew.models.transformer_fields import TransformerFields

FIELD = "trainer.init_from"
CONFIG, GENERATION = "config.json", "generation_config.json"
WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
ARCHITECTURE = Transformer.name
"""dew's architecture whose blocks are these families' (its registered name, read from its class)."""
EMBEDDING = "embed/embedding"
"""The path of the transformer's token embedding (``vocab_size`` rows), as ``trainer.init_skip`` names it."""


@dataclasses.dataclass(frozen=True)
class Family:
    """One Hugging Face causal LM family dew reads and writes."""

    architecture: str
    """``config.json``'s ``architectures`` entry (transformers' class)."""
    model_type: str
    """``config.json``'s ``model_type``."""
    field: str | None
    """The ``transformer`` field that sets it apart from Llama (None: Llama itself)."""


FAMILIES = {
    f.architecture: f
    for f in (
        Family("LlamaForCausalLM", "llama", None),
        Family("Qwen2ForCausalLM", "qwen2", "qkv_bias"),
        Family("Qwen3ForCausalLM", "qwen3", "qk_norm"),
        Family("MistralForCausalLM", "mistral", "sliding_window"),
    )
}
"""The families by transformers' class name."""

ROPE_TYPES = ("default", "linear", "llama3")
"""The ``rope_type`` values dew computes (``default``: no scaling)."""

CHECKED = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "depth": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "mlp_hidden": "intermediate_size",
    "norm_eps": "rms_norm_eps",
    "rope_theta": "rope_theta",
    "rope_scaling": "rope_scaling",
    "tie_embeddings": "tie_word_embeddings",
    "qkv_bias": "architectures",
    "qk_norm": "architectures",
    "sliding_window": "sliding_window",
}
"""Each ``model.config`` field a directory gives -> the ``config.json`` field it comes from."""


# ------------------------------------------------------------------------------------ where it is


def is_directory(path: str) -> bool:
    """Whether ``path`` holds a Hugging Face model directory's files: ``config.json`` and the weights."""
    has_weights = os.path.isfile(os.path.join(path, WEIGHTS)) or os.path.isfile(os.path.join(path, INDEX))
    return has_weights and os.path.isfile(os.path.join(path, CONFIG))


def local_directory(name: str, field: str = FIELD) -> str | None:
    """The directory ``name`` stands for: ``name`` itself when it is a path, or a hub name's snapshot
    in the local Hugging Face cache (the hub offline; a name the cache lacks is refused, naming the
    cache). None for a path that does not exist (the caller says what it is not)."""
    if not hub_name(name):
        return os.path.expanduser(name) if os.path.exists(os.path.expanduser(name)) else None
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return str(snapshot_download(name, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError) as err:
        raise ValueError(
            f"{field}={name!r}: no such directory, and no model of that name in the local Hugging Face "
            f"cache ({constants.HF_HUB_CACHE}); dew reads the hub offline: download it first "
            f"(hf download {name}) or give its directory ({type(err).__name__})"
        ) from None


# -------------------------------------------------------------------------------- config.json in


def read_config(path: str, field: str = FIELD) -> dict[str, Any]:
    """The directory's ``config.json``, after refusing what dew's transformer does not model."""
    file = os.path.join(path, CONFIG)
    try:
        with open(file) as fh:
            config = json.load(fh)
    except json.JSONDecodeError as err:
        raise ValueError(f"{field}={path!r}: {file} is not JSON ({err})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{field}={path!r}: {file} holds {type(config).__name__}, not an object")
    refuse_unmodelled(config, path, field)
    return config


def family_of(config: Mapping[str, Any], path: str, field: str = FIELD) -> Family:
    """The family ``config.json``'s ``architectures`` names, or a refusal naming what dew reads."""
    held = config.get("architectures") or []
    for name in held:
        if name in FAMILIES:
            return FAMILIES[name]
    raise ValueError(
        f"{field}={path!r}: config.json has architectures={held} (model_type {config.get('model_type')!r}); "
        f"dew reads {', '.join(FAMILIES)}"
    )


def refuse_unmodelled(config: Mapping[str, Any], path: str, field: str = FIELD) -> None:
    """Raise naming the first ``config.json`` field that asks for what dew's transformer does not
    compute: a model with it would load and compute something else."""
    where = f"{field}={path!r}: config.json has"
    family = family_of(config, path, field)
    refusals = {
        "attention_bias": "dew's attention has biases on the query, key and value projections alone, "
        "as Qwen2's (model.config.qkv_bias), none on the output projection",
        "mlp_bias": "dew's MLP has no biases",
        "use_sliding_window": "dew's window is every layer's, as Mistral's sliding_window",
        "quantization_config": "dew reads float32, bfloat16 or float16 weights",
    }
    if family.field is None:  # Qwen's sliding_window is unused without use_sliding_window; Mistral's is read
        refusals["sliding_window"] = "dew's Llama sees every earlier position (a window is Mistral's)"
    for key, why in refusals.items():
        if config.get(key):
            raise ValueError(f"{where} {key}={config[key]!r}; {why}")
    kinds = sorted(set(config.get("layer_types") or []))
    alike = len(kinds) <= 1 and (family.field == "sliding_window" or kinds in ([], ["full_attention"]))
    if not alike:
        raise ValueError(
            f"{where} layer_types with {', '.join(map(repr, kinds))}; dew's layers all attend alike "
            "(every earlier position, or Mistral's sliding_window on every layer)"
        )
    if config.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(f"{where} hidden_act={config['hidden_act']!r}; dew's MLP is SwiGLU (silu)")
    if config.get("attention_dropout", 0.0):
        raise ValueError(f"{where} attention_dropout={config['attention_dropout']}; dew's attention has no dropout")
    rope_of(config, path, field)


def rope_of(config: Mapping[str, Any], path: str, field: str = FIELD) -> tuple[float, RopeScaling | None]:
    """``(rope_theta, rope_scaling)`` of a ``config.json`` in either spelling: transformers 4's
    top-level ``rope_theta`` and ``rope_scaling`` (whose type may be ``type``), or transformers 5's
    ``rope_parameters``. A ``rope_type`` other than ``ROPE_TYPES`` is refused by name."""
    where = f"{field}={path!r}: config.json has"
    params: dict[str, Any] = {}
    kinds = {}
    for key in ("rope_scaling", "rope_parameters"):
        value = config.get(key)
        if value is not None and not isinstance(value, Mapping):
            raise ValueError(f"{where} {key}={value!r}; expected an object")
        params |= value or {}
        if value:
            kinds[key] = value.get("rope_type", value.get("type", "default"))
    if len(set(kinds.values())) > 1:
        raise ValueError(f"{where} " + " and ".join(f"{k}'s rope_type={v!r}" for k, v in kinds.items()))
    theta = config.get("rope_theta", params.get("rope_theta", 10000.0))  # 10000: LlamaConfig's default
    if "rope_theta" in config and "rope_theta" in params and params["rope_theta"] != config["rope_theta"]:
        raise ValueError(
            f"{where} rope_theta={config['rope_theta']} and rope_parameters.rope_theta={params['rope_theta']}"
        )
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        why = " (dynamic NTK scaling changes the frequencies with each call's length)" if kind == "dynamic" else ""
        raise ValueError(f"{where} rope_type={kind!r}; dew's rotary embedding computes {', '.join(ROPE_TYPES)}{why}")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"{where} partial_rotary_factor={params['partial_rotary_factor']}; dew rotates every feature")
    if kind == "default":
        return float(theta), None
    fields = {"rope_type": kind, "factor": float(params["factor"])}
    if kind == "llama3":
        for key in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if key not in params:
                raise ValueError(f"{where} rope_type='llama3' without {key}")
            fields[key] = params[key]
    return float(theta), RopeScaling(**fields)


def scaling_dict(scaling: RopeScaling | None) -> dict[str, Any] | None:
    """``model.config.rope_scaling`` as a record holds it (the llama3-only fields for llama3 alone)."""
    if scaling is None:
        return None
    out: dict[str, Any] = {"rope_type": scaling.rope_type, "factor": scaling.factor}
    if scaling.rope_type == "llama3":
        out |= {
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        }
    return out


def model_config(path: str, field: str = FIELD) -> dict[str, Any]:
    """The ``model.config`` of dew's ``transformer`` that the directory ``path`` fills: every field
    ``CHECKED`` names (``seq_len`` follows the data). ``vocab_size`` is the embedding's rows, which
    may be more than the tokenizer's ids (Qwen2.5-0.5B: 151,936 rows for 151,665 tokens, padded to
    a multiple of 128); the data's ids lie below it (``Architecture.padded_fields``)."""
    c = read_config(path, field)
    family = family_of(c, path, field)
    theta, scaling = rope_of(c, path, field)
    heads = c["num_attention_heads"]
    return {
        "vocab_size": c["vocab_size"],
        "hidden_size": c["hidden_size"],
        "depth": c["num_hidden_layers"],
        "num_heads": heads,
        "num_kv_heads": c.get("num_key_value_heads") or heads,
        "head_dim": c.get("head_dim") or c["hidden_size"] // heads,
        "mlp_hidden": c["intermediate_size"],
        "norm_eps": c.get("rms_norm_eps", 1e-6),
        "rope_theta": theta,
        "rope_scaling": scaling_dict(scaling),
        "tie_embeddings": bool(c.get("tie_word_embeddings", False)),
        "qkv_bias": family.field == "qkv_bias",
        "qk_norm": family.field == "qk_norm",
        "sliding_window": c.get("sliding_window") if family.field == "sliding_window" else None,
    }


# --------------------------------------------------------------------- the run's model from it


def with_checkpoint_fields[R: RunConfig](run: R) -> R:
    """``run`` with every ``model.config`` field that ``trainer.init_from``'s Hugging Face directory
    gives (``model_config``) and the run does not set filled in from its ``config.json``; a field
    the run sets to another value is refused by name, as a data field is. Without such a directory
    (no ``init_from``, a dew run, another architecture, a directory no longer there whose fields the
    record already holds) ``run`` is returned as it is. A run whose ``trainer.init_skip`` leaves the
    embedding (``EMBEDDING``) freshly initialised has a vocabulary of its own: its ``vocab_size``
    follows its data (or its own value), not the directory."""
    source = run.trainer.init_from
    if source is None or run.model.architecture != ARCHITECTURE:
        return run
    directory = local_directory(source) if "://" not in source else None
    if directory is None or not is_directory(directory):
        return run
    theirs = model_config(directory)
    if any(re.fullmatch(pattern, EMBEDDING) for pattern in run.trainer.init_skip):
        del theirs["vocab_size"]
    given = dict(run.model.config)
    for key in theirs.keys() & given.keys():
        if _typed(key, given[key]) != _typed(key, theirs[key]):
            raise ConfigError(
                f"model.config.{key}={_show(given[key])} conflicts with {CONFIG} of {FIELD}={source!r} "
                f"({CHECKED[key]} gives {key}={_show(theirs[key])}); drop the field and it follows the directory"
            )
    config = {**theirs, **given}
    return dataclasses.replace(run, model=dataclasses.replace(run.model, config=config))


def _typed(key: str, value: object) -> object:
    """``value`` of ``model.config.key`` as compared: a ``rope_scaling`` with the defaults of the
    fields it leaves out (numbers compare as numbers: ``500000 == 500000.0``)."""
    if key == "rope_scaling" and isinstance(value, Mapping):
        try:
            return RopeScaling(**value)
        except (TypeError, ValueError):
            return value
    return value


def _show(value: object) -> str:
    return json.dumps(value).replace('"', "") if isinstance(value, (dict, bool)) or value is None else str(value)


# ------------------------------------------------------------------------------- config.json out


def family_for(f: TransformerFields, where: str) -> Family:
    """The family that holds a model of fields ``f``: the one whose field it sets, Llama where it
    sets none; two such fields are refused by name (no family has both)."""
    set_fields = [
        name
        for name, on in (("qkv_bias", f.qkv_bias), ("qk_norm", f.qk_norm), ("sliding_window", f.sliding_window))
        if on
    ]
    if len(set_fields) > 1:
        names = {fam.field: fam.architecture for fam in FAMILIES.values()}
        raise ValueError(
            f"{where}: model.config sets {' and '.join(set_fields)}; no Hugging Face family has both "
            f"({', '.join(f'{n}: {names[n]}' for n in set_fields)})"
        )
    field = set_fields[0] if set_fields else None
    return next(fam for fam in FAMILIES.values() if fam.field == field)


def rope_parameters(f: TransformerFields) -> dict[str, Any]:
    """transformers 5's ``rope_parameters`` for ``f``'s rotary embedding."""
    scaling = scaling_dict(f.rope_scaling)
    if scaling is None:
        return {"rope_theta": f.rope_theta, "rope_type": "default"}
    return {"rope_theta": f.rope_theta, **scaling}


def max_positions(f: TransformerFields) -> int:
    """``max_position_embeddings``: the run's ``seq_len``; with llama3 scaling at least the context it
    scales to, ``original_max_position_embeddings · factor`` (transformers wants the original below it)."""
    s = f.rope_scaling
    if s is not None and s.rope_type == "llama3":
        return max(f.seq_len, math.ceil(s.original_max_position_embeddings * s.factor))
    return f.seq_len


def config_json(
    f: TransformerFields, mlp_hidden: int, *, dtype: str = "float32", eos_token_id: int | None = None
) -> dict[str, Any]:
    """The ``config.json`` of ``transformer`` fields ``f`` (SwiGLU width ``mlp_hidden``), weights
    stored in ``dtype``, in its family's spelling (``family_for``): the current one
    (``rope_parameters``, ``dtype``) and the fields transformers 4 reads (``rope_theta``,
    ``rope_scaling``, ``torch_dtype``)."""
    family = family_for(f, "dew-export")
    rope = rope_parameters(f)
    scaling = None if f.rope_scaling is None else {k: v for k, v in rope.items() if k != "rope_theta"}
    out: dict[str, Any] = {
        "architectures": [family.architecture],
        "model_type": family.model_type,
        "hidden_size": f.hidden_size,
        "intermediate_size": mlp_hidden,
        "num_hidden_layers": f.depth,
        "num_attention_heads": f.num_heads,
        "num_key_value_heads": f.num_kv_heads or f.num_heads,
        "head_dim": f.head_dim or f.hidden_size // f.num_heads,
        "rms_norm_eps": f.norm_eps,
        "rope_parameters": rope,
        "rope_theta": f.rope_theta,
        "rope_scaling": scaling,
        "vocab_size": f.vocab_size,
        "max_position_embeddings": max_positions(f),
        "tie_word_embeddings": f.tie_embeddings,
        "dtype": dtype,
        "torch_dtype": dtype,
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "initializer_range": f.init_std,
        "bos_token_id": None,
        "eos_token_id": eos_token_id,
        "pad_token_id": None,
        "use_cache": True,
    }
    if family.field is None:
        out |= {"attention_bias": False, "mlp_bias": False}
    elif family.field == "sliding_window":
        out["sliding_window"] = f.sliding_window
    else:  # Qwen2 and Qwen3: no window on any layer
        out |= {"use_sliding_window": False, "sliding_window": None, "max_window_layers": f.depth}
        if family.field == "qk_norm":
            out["attention_bias"] = False
    return out


def generation_json(eos_token_id: int | None) -> dict[str, Any]:
    """``generation_config.json``: what ``model.generate`` stops on."""
    return {"bos_token_id": None, "eos_token_id": eos_token_id, "pad_token_id": None}
