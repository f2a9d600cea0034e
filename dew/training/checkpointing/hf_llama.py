"""The Hugging Face layout of dew's ``transformer``, both ways: the safetensors weights of a
``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM`` or ``MistralForCausalLM``
(``config.json``, family by family, is ``dew.training.checkpointing.hf_config``'s), written by
``dew-export`` and read by ``trainer.init_from``. The files themselves (one ``model.safetensors`` or
shards behind ``model.safetensors.index.json``, float32, bfloat16 or float16) are
``dew.training.checkpointing.hf_weights``'s.

dew's blocks are Llama's: pre-norm RMSNorm, rotary embeddings on (first half, second half) feature
pairs (Llama's ``rotate_half``: no permutation of the query and key weights), grouped-query
attention where query head ``n`` reads key head ``n // group`` (Llama's ``repeat_kv``), SwiGLU, no
biases. The three other families add one thing each, under the names they give it: Qwen2 the
biases of ``q_proj``, ``k_proj`` and ``v_proj``, Qwen3 the per-head ``q_norm`` and ``k_norm``,
Mistral a sliding window (no tensor). ``TABLE`` maps each dew parameter to its name and layout
there: the linear weights are ``[out, in]``, dew's kernels ``[in, out]`` with heads split out, and
dew's blocks are stacked on a leading ``depth`` axis where transformers names each layer.

What dew has and these families have not is folded into the weights exactly, as a scale
(``factors``): ``embedding_multiplier`` into the embedding, ``residual_multiplier`` into each
branch's output projection, muP's attention scale (``dew.models.decoder.attention_scale``) into the
query weights and bias (transformers scales by ``1/sqrt(head_dim)``; rotary embeddings are linear,
so a scaled query rotates to the scaled rotated query; under QK-norm the scale cannot pass the
norm, and is refused) and muP's logit divisor into the output head. Reading divides by the same
factors, so a dew run with those settings reads back what it wrote. A tied head whose embedding
and head would need different factors is refused by name.
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
from dew.models.transformer import TransformerFields
from dew.training.checkpointing import hf_config
from dew.training.checkpointing.hf_config import FIELD, model_config, refuse_unmodelled

if TYPE_CHECKING:
    from dew.contract.config import RunConfig

__all__ = ["model_config", "refuse_unmodelled"]  # hf_config's, named here too for the callers that read a directory

Layout = Callable[[Any], Any]


ARCHITECTURE = hf_config.ARCHITECTURE
"""The architecture whose blocks are Llama's (its registered name, read from its class)."""


def fields_of(run: RunConfig | TransformerFields) -> TransformerFields:
    """The ``transformer`` fields of a run (or the fields themselves)."""
    if isinstance(run, TransformerFields):
        return run
    return of(run.model.architecture, run.model.fields()).fields


def refuse_unmappable(f: TransformerFields, where: str) -> None:
    """Raise naming the field when the model has what no family has and cannot be folded."""
    hf_config.family_for(f, where)
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
    """The scale each dew parameter takes in the Hugging Face layout (1 where none is listed). The
    attention scale goes into the query projection (weight and bias), or under QK-norm into the
    query norm's scale, whose output the query is (the norm would divide it out of the projection)."""
    hd = f.head_dim or f.hidden_size // f.num_heads
    m = f.hidden_size / f.mup_base_width if f.mup else 1.0
    r = f.residual_multiplier
    query = attention_scale(f) * math.sqrt(hd)
    out = {
        "embed/embedding": f.embedding_multiplier,
        "blocks/attn/o/kernel": r,
        "blocks/mlp_down/kernel": r,
        "lm_head/kernel": 1.0 / m,
    }
    if f.qk_norm:
        return out | {"blocks/attn/q_norm/scale": query}
    return out | {"blocks/attn/q/kernel": query, "blocks/attn/q/bias": query}


def table(f: TransformerFields) -> dict[str, tuple[str, Layout, Layout]]:
    """dew parameter -> (transformers' name, ``{i}`` for a block's layer, dew layout -> theirs, back).
    A block's layouts act on one layer (the stack's ``depth`` axis taken off); every one is a
    reshape or a transpose, so on a contiguous NumPy array the way there is a view of it, through
    which a reader writes Llama's tensor straight into dew's layout (``hf_weights.read``)."""
    D, N = f.hidden_size, f.num_heads
    K, hd = f.num_kv_heads or N, f.head_dim or D // N

    def heads_out(n: int) -> tuple[Layout, Layout]:  # (D, n, hd) <-> [n*hd, D]
        return (lambda w: w.reshape(D, n * hd).T), (lambda w: w.T.reshape(D, n, hd))

    def heads_flat(n: int) -> tuple[Layout, Layout]:  # (n, hd) <-> [n*hd]
        return (lambda w: w.reshape(n * hd)), (lambda w: w.reshape(n, hd))

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
    if f.qkv_bias:  # Qwen2's
        for key, n in (("q", N), ("k", K), ("v", K)):
            names[f"blocks/attn/{key}/bias"] = (layer + f"self_attn.{key}_proj.bias", *heads_flat(n))
    if f.qk_norm:  # Qwen3's: one scale of head_dim for every head
        for key in ("q", "k"):
            names[f"blocks/attn/{key}_norm/scale"] = (layer + f"self_attn.{key}_norm.weight", *same)
    if f.tie_embeddings:  # the head is the embedding: transformers writes no lm_head.weight
        del names["lm_head/kernel"]
    return names


# ------------------------------------------------------------------------------- config.json out


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


def config_json(f: TransformerFields, *, dtype: str = "float32", eos_token_id: int | None = None) -> dict[str, Any]:
    """The ``config.json`` of a model of fields ``f`` in its family's spelling (``hf_config.config_json``)."""
    return hf_config.config_json(f, mlp_hidden(f), dtype=dtype, eos_token_id=eos_token_id)


# -------------------------------------------------------------------------------- config.json in


def check_config(f: TransformerFields, path: str) -> None:
    """Refuse a directory whose config differs from ``f`` (a run that states its ``model.config``,
    or one written before ``trainer.init_from`` filled it), naming both fields and both values."""
    refuse_unmappable(f, FIELD)
    theirs = hf_config.model_config(path)
    ours = {
        "num_heads": f.num_heads,
        "num_kv_heads": f.num_kv_heads or f.num_heads,
        "head_dim": f.head_dim or f.hidden_size // f.num_heads,
        "rope_theta": f.rope_theta,
        "rope_scaling": hf_config.scaling_dict(f.rope_scaling),
        "norm_eps": f.norm_eps,
        "tie_embeddings": f.tie_embeddings,
        "qkv_bias": f.qkv_bias,
        "qk_norm": f.qk_norm,
        "sliding_window": f.sliding_window,
    }
    for key, value in ours.items():
        if theirs[key] != value:
            hf_key = hf_config.CHECKED[key]
            shown = _show(config_value(path, hf_key)) if hf_key == "architectures" else _show(theirs[key])
            raise ValueError(
                f"{FIELD}={path!r}: config.json has {hf_key}={shown}, this model "
                f"model.config.{key}={_show(value)}; set model.config.{key}={_show(theirs[key])}"
            )


def config_value(path: str, key: str) -> object:
    with open(os.path.join(path, hf_config.CONFIG)) as fh:
        return json.load(fh).get(key)


def _show(value: object) -> str:
    if isinstance(value, (dict, bool, list)) or value is None:
        return json.dumps(value).replace('"', "")
    return str(value)
