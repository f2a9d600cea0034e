"""The Hugging Face Llama layout of dew's ``transformer``, both ways: ``config.json``
(``LlamaForCausalLM``) and ``model.safetensors``, written by ``dew-export`` and read by
``trainer.init_from``.

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
dew run with those settings reads back what it wrote. QK-norm has no place in Llama and a tied head
is not written: both are refused by name.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from dew.contract.models import of
from dew.models.decoder import attention_scale, mlp_hidden
from dew.models.transformer import Transformer, TransformerFields

if TYPE_CHECKING:
    from flax.typing import PathParts

    from dew.contract.config import RunConfig

FIELD = "trainer.init_from"
CONFIG, WEIGHTS = "config.json", "model.safetensors"

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
        raise ValueError(
            f"{where}: model.config.tie_embeddings=true: this layout is written with an untied "
            "head (tie_word_embeddings=false)"
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
    A block's layouts act on one layer (the stack's ``depth`` axis taken off)."""
    D, N = f.hidden_size, f.num_heads
    K, hd = f.num_kv_heads or N, f.head_dim or D // N

    def heads_out(n: int) -> tuple[Layout, Layout]:  # (D, n, hd) <-> [n*hd, D]
        return (lambda w: w.reshape(D, n * hd).T), (lambda w: w.T.reshape(D, n, hd))

    same: tuple[Layout, Layout] = (lambda w: w, lambda w: w)
    transposed: tuple[Layout, Layout] = (lambda w: w.T, lambda w: w.T)
    layer = "model.layers.{i}."
    return {
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


def config_json(f: TransformerFields) -> dict[str, Any]:
    """Llama's ``config.json`` for ``transformer`` fields ``f``."""
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
        "rope_theta": f.rope_theta,
        "vocab_size": f.vocab_size,
        "max_position_embeddings": f.seq_len,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": f.init_std,
    }


# ---------------------------------------------------------------------------------------- out


def write(f: TransformerFields, params: dict[str, jax.Array], out: str) -> None:
    """Write ``params`` (dew path -> array, a ``transformer`` with fields ``f``) to ``out`` in
    Llama's layout, in float32."""
    from safetensors.numpy import save_file

    refuse_unmappable(f, "dew-export")
    scale = factors(f)
    tensors = {}
    for key, (name, to_hf, _) in table(f).items():
        value = np.asarray(jax.device_get(params[key]), np.float32) * np.float32(scale.get(key, 1.0))
        layers = [(name.format(i=i), value[i]) for i in range(f.depth)] if "{i}" in name else [(name, value)]
        for hf_name, v in layers:
            tensors[hf_name] = np.ascontiguousarray(to_hf(v))
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, WEIGHTS), metadata={"format": "pt"})
    with open(os.path.join(out, CONFIG), "w") as fh:
        json.dump(config_json(f), fh, indent=2)


# ----------------------------------------------------------------------------------------- in


def check_config(f: TransformerFields, path: str) -> None:
    """Refuse a Llama directory whose config differs from ``f`` where shapes do not show it."""
    refuse_unmappable(f, FIELD)
    with open(os.path.join(path, CONFIG)) as fh:
        theirs = json.load(fh)
    if "LlamaForCausalLM" not in theirs.get("architectures", []):
        raise ValueError(f"{FIELD}={path!r}: config.json names {theirs.get('architectures')}, not LlamaForCausalLM")
    ours = config_json(f)
    for key in ("num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps"):
        value = theirs.get(key)
        if value is None and key == "head_dim":  # Llama's default
            value = theirs["hidden_size"] // theirs["num_attention_heads"]
        if value is None and key == "num_key_value_heads":
            value = theirs["num_attention_heads"]
        if value != ours[key]:
            raise ValueError(f"{FIELD}={path!r}: config.json has {key}={value}, this model {ours[key]}")
    if theirs.get("tie_word_embeddings"):
        raise ValueError(f"{FIELD}={path!r}: config.json has tie_word_embeddings=true; dew reads an untied head")
    if theirs.get("attention_bias") or theirs.get("mlp_bias"):
        raise ValueError(f"{FIELD}={path!r}: config.json has biases; dew's transformer has none")


def dew_shapes(run: RunConfig | TransformerFields, path: str) -> dict[str, tuple[int, ...]]:
    """The shapes the Llama directory ``path`` gives dew's parameters (a block's with ``depth`` in
    front), after checking its config against the run's model."""
    from safetensors import safe_open

    if not isinstance(run, TransformerFields) and run.model.architecture != ARCHITECTURE:
        raise ValueError(
            f"{FIELD}={path!r}: a Hugging Face Llama directory starts a {ARCHITECTURE!r} run, "
            f"not {run.model.architecture!r}"
        )
    f = fields_of(run)
    check_config(f, path)
    with safe_open(os.path.join(path, WEIGHTS), "np") as fh:
        header = {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}  # noqa: SIM118 - safetensors' safe_open is not iterable
    depth = sum(1 for k in header if k.endswith(".input_layernorm.weight"))
    shapes = {}
    for key, (name, _, from_hf) in table(f).items():
        first = name.format(i=0)
        if first not in header:
            continue
        try:
            one = jax.eval_shape(from_hf, jax.ShapeDtypeStruct(header[first], np.float32)).shape
        except TypeError:  # a reshape that cannot take the saved shape
            shapes[key] = header[first]
            continue
        shapes[key] = (depth, *one) if "{i}" in name else tuple(one)
    return shapes


def read(
    run: RunConfig | TransformerFields, path: str, target: dict[PathParts, jax.ShapeDtypeStruct]
) -> dict[PathParts, jax.Array]:
    """The Llama directory's values for ``target`` (flat ``{path: ShapeDtypeStruct}`` with
    shardings), each built on the devices its sharding names from the slices they hold."""
    from safetensors import safe_open

    f = fields_of(run)
    spec, scale = table(f), factors(f)
    out: dict[PathParts, jax.Array] = {}
    with safe_open(os.path.join(path, WEIGHTS), "np") as fh:
        for p, want in target.items():
            key = "/".join(map(str, p))
            name, _, from_hf = spec[key]
            if "{i}" in name:
                value = np.stack([from_hf(fh.get_tensor(name.format(i=i))) for i in range(f.depth)])
            else:
                value = from_hf(fh.get_tensor(name))
            value = (value / np.float32(scale.get(key, 1.0))).astype(want.dtype)
            out[p] = jax.make_array_from_callback(want.shape, want.sharding, functools.partial(_at, value))
    return out


def _at(value: np.ndarray, index: tuple[slice, ...]) -> np.ndarray:
    """The slice of ``value`` a device holds (``jax.make_array_from_callback``'s callback)."""
    return value[index]
