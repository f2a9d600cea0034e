"""The Hugging Face Llama layout of dew's ``transformer``, both ways: ``config.json``
(``LlamaForCausalLM``) and the safetensors weights, written by ``dew-export`` and read by
``trainer.init_from``. The files themselves (one ``model.safetensors`` or shards behind
``model.safetensors.index.json``, float32, bfloat16 or float16) are ``dew.training.checkpointing.hf_weights``'s.

dew's blocks are Llama's: pre-norm RMSNorm, rotary embeddings on (first half, second half) feature
pairs (Llama's ``rotate_half``: no permutation of the query and key weights), grouped-query
attention where query head ``n`` reads key head ``n // group`` (Llama's ``repeat_kv``), SwiGLU, no
biases. ``TABLE`` maps each dew parameter to its Llama name and layout: Llama's linear weights are
``[out, in]``, dew's kernels ``[in, out]`` with heads split out, and dew's blocks are stacked on a
leading ``depth`` axis where Llama names each layer.

What dew has and Llama has not is folded into the weights exactly, as a scale (``factors``):
``embedding_multiplier`` into the embedding, ``residual_multiplier`` into each branch's output
projection, muP's attention scale (``dew.models.decoder.attention_scale``) into the query weights (Llama scales by
``1/sqrt(head_dim)``; rotary embeddings are linear, so a scaled query rotates to the scaled rotated
query) and muP's logit divisor into the output head. Reading divides by the same factors, so a
dew run with those settings reads back what it wrote. QK-norm has no place in Llama, nor has a tied
head whose embedding and head would need different factors: both are refused by name.

``config.json`` comes in two spellings: transformers 4 writes ``rope_theta`` and ``rope_scaling``
at the top level, transformers 5 one ``rope_parameters`` object (``{rope_theta, rope_type, ...}``);
``rope_of`` reads both, and ``config_json`` writes both, so old and new readers load what dew writes.
What a Llama directory may hold and dew does not model (biases, a sliding window, another
activation, a RoPE dynamic in the sequence length, quantized weights) is refused naming the field
(``refuse_unmodelled``), never ignored.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from dew.contract.models import of
from dew.models.decoder import attention_scale, mlp_hidden
from dew.models.rope_scaling import RopeScaling
from dew.models.transformer import Transformer, TransformerFields

if TYPE_CHECKING:
    from dew.contract.config import RunConfig

FIELD = "trainer.init_from"
CONFIG, GENERATION = "config.json", "generation_config.json"

Layout = Callable[[Any], Any]


ARCHITECTURE = Transformer.name
"""The architecture whose blocks are Llama's (its registered name, read from its class)."""


def fields_of(run: RunConfig | TransformerFields) -> TransformerFields:
    """The ``transformer`` fields of a run (or the fields themselves)."""
    if isinstance(run, TransformerFields):
        return run
    return of(run.model.architecture, run.model.fields()).fields


def refuse_unmappable(f: TransformerFields, where: str) -> None:
    """Raise naming the field when the model has what Llama has not and cannot be folded."""
    if f.qk_norm:
        raise ValueError(
            f"{where}: model.config.qk_norm=true: Llama has no QK-norm, and it cannot be folded "
            "into the weights (it normalises each query and key)"
        )
    if f.tie_embeddings:
        scale = factors(f)
        if scale["embed/embedding"] != 1.0 or scale["lm_head/kernel"] != 1.0:
            raise ValueError(
                f"{where}: model.config.tie_embeddings=true with embedding_multiplier="
                f"{f.embedding_multiplier} and mup={str(f.mup).lower()}: a tied Llama head is the "
                "embedding itself, so neither the embedding multiplier nor muP's logit divisor can be "
                "folded into it (both must be 1)"
            )


def factors(f: TransformerFields) -> dict[str, float]:
    """The scale each dew parameter takes in Llama's layout (1 where none is listed)."""
    hd = f.head_dim or f.hidden_size // f.num_heads
    m = f.hidden_size / f.mup_base_width if f.mup else 1.0
    r = f.residual_multiplier
    return {
        "embed/embedding": f.embedding_multiplier,
        "blocks/attn/o/kernel": r,
        "blocks/mlp_down/kernel": r,
        "blocks/attn/q/kernel": attention_scale(f) * math.sqrt(hd),
        "lm_head/kernel": 1.0 / m,
    }


def table(f: TransformerFields) -> dict[str, tuple[str, Layout, Layout]]:
    """dew parameter -> (Llama name, ``{i}`` for a block's layer, dew layout -> Llama's, back).
    A block's layouts act on one layer (the stack's ``depth`` axis taken off); every one is a
    reshape or a transpose, so on a contiguous NumPy array the way there is a view of it, through
    which a reader writes Llama's tensor straight into dew's layout (``hf_weights.read``)."""
    D, N = f.hidden_size, f.num_heads
    K, hd = f.num_kv_heads or N, f.head_dim or D // N

    def heads_out(n: int) -> tuple[Layout, Layout]:  # (D, n, hd) <-> [n*hd, D]
        return (lambda w: w.reshape(D, n * hd).T), (lambda w: w.T.reshape(D, n, hd))

    same: tuple[Layout, Layout] = (lambda w: w, lambda w: w)
    transposed: tuple[Layout, Layout] = (lambda w: w.T, lambda w: w.T)
    layer = "model.layers.{i}."
    names = {
        "embed/embedding": ("model.embed_tokens.weight", *same),
        "blocks/attn_norm/scale": (layer + "input_layernorm.weight", *same),
        "blocks/attn/q/kernel": (layer + "self_attn.q_proj.weight", *heads_out(N)),
        "blocks/attn/k/kernel": (layer + "self_attn.k_proj.weight", *heads_out(K)),
        "blocks/attn/v/kernel": (layer + "self_attn.v_proj.weight", *heads_out(K)),
        "blocks/attn/o/kernel": (
            layer + "self_attn.o_proj.weight",  # (N, hd, D) <-> [D, N*hd]
            lambda w: w.reshape(N * hd, D).T,
            lambda w: w.T.reshape(N, hd, D),
        ),
        "blocks/mlp_norm/scale": (layer + "post_attention_layernorm.weight", *same),
        "blocks/mlp_gate/kernel": (layer + "mlp.gate_proj.weight", *transposed),
        "blocks/mlp_up/kernel": (layer + "mlp.up_proj.weight", *transposed),
        "blocks/mlp_down/kernel": (layer + "mlp.down_proj.weight", *transposed),
        "final_norm/scale": ("model.norm.weight", *same),
        "lm_head/kernel": ("lm_head.weight", *transposed),
    }
    if f.tie_embeddings:  # the head is the embedding: Llama writes no lm_head.weight
        del names["lm_head/kernel"]
    return names


# ------------------------------------------------------------------------------- config.json out


def rope_parameters(f: TransformerFields) -> dict[str, Any]:
    """transformers 5's ``rope_parameters`` for ``f``'s rotary embedding."""
    s = f.rope_scaling
    if s is None:
        return {"rope_theta": f.rope_theta, "rope_type": "default"}
    out: dict[str, Any] = {"rope_theta": f.rope_theta, "rope_type": s.rope_type, "factor": s.factor}
    if s.rope_type == "llama3":
        out |= {
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
        }
    return out


def config_json(f: TransformerFields, *, dtype: str = "float32", eos_token_id: int | None = None) -> dict[str, Any]:
    """Llama's ``config.json`` for ``transformer`` fields ``f``, weights stored in ``dtype``: the
    current spelling (``rope_parameters``, ``dtype``) and the fields transformers 4 reads
    (``rope_theta``, ``rope_scaling``, ``torch_dtype``)."""
    rope = rope_parameters(f)
    scaling = None if f.rope_scaling is None else {k: v for k, v in rope.items() if k != "rope_theta"}
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": f.hidden_size,
        "intermediate_size": mlp_hidden(f),
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
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": f.init_std,
        "bos_token_id": None,
        "eos_token_id": eos_token_id,
        "pad_token_id": None,
        "use_cache": True,
    }


def max_positions(f: TransformerFields) -> int:
    """``max_position_embeddings``: the run's ``seq_len``; with llama3 scaling at least the context it
    scales to, ``original_max_position_embeddings · factor`` (transformers wants the original below it)."""
    s = f.rope_scaling
    if s is not None and s.rope_type == "llama3":
        return max(f.seq_len, math.ceil(s.original_max_position_embeddings * s.factor))
    return f.seq_len


def generation_json(eos_token_id: int | None) -> dict[str, Any]:
    """``generation_config.json``: what ``model.generate`` stops on."""
    return {"bos_token_id": None, "eos_token_id": eos_token_id, "pad_token_id": None}


def tensors(f: TransformerFields, params: Mapping[str, jax.Array], dtype: np.dtype) -> dict[str, np.ndarray]:
    """``params`` (dew path -> array, a ``transformer`` with fields ``f``) as Llama's tensors in
    ``dtype``, in Llama's order: the embedding, each layer's tensors, the final norm, the head. The
    factors are applied in float32 and the result rounded once to ``dtype``."""
    refuse_unmappable(f, "dew-export")
    scale = factors(f)
    layers: dict[int, dict[str, np.ndarray]] = {}
    for key, (name, to_hf, _) in table(f).items():
        value = np.asarray(jax.device_get(params[key]), np.float32) * np.float32(scale.get(key, 1.0))
        for i in range(f.depth) if "{i}" in name else [-1 if key == "embed/embedding" else f.depth]:
            one = value[i] if "{i}" in name else value
            layers.setdefault(i, {})[name.format(i=i)] = np.ascontiguousarray(to_hf(one)).astype(dtype)
    return {name: v for i in sorted(layers) for name, v in layers[i].items()}


# -------------------------------------------------------------------------------- config.json in


def read_config(path: str) -> dict[str, Any]:
    """The directory's ``config.json``, after refusing what dew's transformer does not model."""
    with open(os.path.join(path, CONFIG)) as fh:
        config = json.load(fh)
    refuse_unmodelled(config, path)
    return config


def refuse_unmodelled(config: Mapping[str, Any], path: str) -> None:
    """Raise naming the first ``config.json`` field that asks for what dew's transformer does not
    compute: a Llama with it would load and compute something else."""
    where = f"{FIELD}={path!r}: config.json has"
    if "LlamaForCausalLM" not in (config.get("architectures") or []):
        raise ValueError(f"{where} architectures={config.get('architectures')}, not LlamaForCausalLM")
    refusals = {
        "attention_bias": "dew's attention has no biases",
        "mlp_bias": "dew's MLP has no biases",
        "sliding_window": "dew's attention sees every earlier position",
        "quantization_config": "dew reads float32, bfloat16 or float16 weights",
    }
    for key, why in refusals.items():
        if config.get(key):
            raise ValueError(f"{where} {key}={config[key]!r}; {why}")
    if config.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(f"{where} hidden_act={config['hidden_act']!r}; dew's MLP is SwiGLU (silu)")
    if config.get("attention_dropout", 0.0):
        raise ValueError(f"{where} attention_dropout={config['attention_dropout']}; dew's attention has no dropout")
    rope_of(config, path)


ROPE_TYPES = ("default", "linear", "llama3")
"""The ``rope_type`` values dew computes (``default``: no scaling)."""


def rope_of(config: Mapping[str, Any], path: str) -> tuple[float, RopeScaling | None]:
    """``(rope_theta, rope_scaling)`` of a Llama ``config.json`` in either spelling: transformers
    4's top-level ``rope_theta`` and ``rope_scaling`` (whose type may be ``type``), or transformers
    5's ``rope_parameters``. A ``rope_type`` other than ``ROPE_TYPES`` is refused by name."""
    where = f"{FIELD}={path!r}: config.json has"
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


def model_config(path: str) -> dict[str, Any]:
    """The ``model.config`` of dew's ``transformer`` that the Llama directory ``path`` fills:
    start a run from it with these (``seq_len`` and ``vocab_size`` follow the data)."""
    c = read_config(path)
    theta, scaling = rope_of(c, path)
    heads = c["num_attention_heads"]
    out: dict[str, Any] = {
        "hidden_size": c["hidden_size"],
        "depth": c["num_hidden_layers"],
        "num_heads": heads,
        "num_kv_heads": c.get("num_key_value_heads") or heads,
        "head_dim": c.get("head_dim") or c["hidden_size"] // heads,
        "mlp_hidden": c["intermediate_size"],
        "norm_eps": c.get("rms_norm_eps", 1e-6),
        "rope_theta": theta,
        "rope_scaling": None if scaling is None else _as_dict(scaling),
        "tie_embeddings": bool(c.get("tie_word_embeddings", False)),
    }
    return out


def _as_dict(scaling: RopeScaling) -> dict[str, Any]:
    out = {"rope_type": scaling.rope_type, "factor": scaling.factor}
    if scaling.rope_type == "llama3":
        out |= {
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        }
    return out


CHECKED = {
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "rope_theta": "rope_theta",
    "rope_scaling": "rope_scaling",
    "norm_eps": "rms_norm_eps",
    "tie_embeddings": "tie_word_embeddings",
}
"""The fields that shapes cannot tell: ``model.config`` field -> the ``config.json`` field."""


def check_config(f: TransformerFields, path: str) -> None:
    """Refuse a Llama directory whose config differs from ``f`` where shapes do not show it, naming
    both fields and both values."""
    refuse_unmappable(f, FIELD)
    theirs = model_config(path)
    ours = {
        "num_heads": f.num_heads,
        "num_kv_heads": f.num_kv_heads or f.num_heads,
        "head_dim": f.head_dim or f.hidden_size // f.num_heads,
        "rope_theta": f.rope_theta,
        "rope_scaling": None if f.rope_scaling is None else _as_dict(f.rope_scaling),
        "norm_eps": f.norm_eps,
        "tie_embeddings": f.tie_embeddings,
    }
    for key, hf_key in CHECKED.items():
        if theirs[key] != ours[key]:
            raise ValueError(
                f"{FIELD}={path!r}: config.json has {hf_key}={_show(theirs[key])}, this model "
                f"model.config.{key}={_show(ours[key])}; set model.config.{key}={_show(theirs[key])}"
            )


def _show(value: object) -> str:
    return json.dumps(value).replace('"', "") if isinstance(value, (dict, bool)) or value is None else str(value)
