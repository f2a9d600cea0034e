"""The safetensors files of a Hugging Face Llama, Qwen2, Qwen3 or Mistral directory
(``dew.training.checkpointing.hf_llama`` names and lays out each tensor): one ``model.safetensors``, or shards named by
``model.safetensors.index.json``'s ``weight_map`` (as ``save_pretrained`` writes them above its
``max_shard_size``, and as the hub holds every large model), in float32, bfloat16 or float16.

Reading goes shard by shard: every dew parameter gets one buffer in its ``param_dtype``, each
tensor of the open shard is cast and laid out straight into its place there (a Llama layer is one
slice of dew's stacked blocks), and a shard is closed before the next opens. Once all are read,
each parameter in turn becomes a JAX array on the devices its sharding names and its buffer is
freed; on a CPU device the buffers are 64-byte aligned, which JAX's CPU client adopts as the
array's memory without a copy. The host holds the model once, in dew's dtype, plus one shard's
mapping and one parameter in flight: never two copies of the model (``bench/hf_read.py`` measures
it: docs/performance.md).
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import jax
import ml_dtypes
import numpy as np

from dew.training.checkpointing import hf_config, hf_llama

if TYPE_CHECKING:
    from flax.typing import PathParts

    from dew.contract.config import RunConfig
    from dew.models.transformer import TransformerFields

WEIGHTS, INDEX = hf_config.WEIGHTS, hf_config.INDEX
FIELD = hf_llama.FIELD

DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}
"""The weight dtypes read and written, by the name ``config.json``'s ``dtype`` gives them."""
SAFETENSORS_DTYPES = ("F32", "BF16", "F16")


def is_directory(path: str) -> bool:
    """Whether ``path`` holds a Hugging Face model directory's files: ``config.json`` and the weights."""
    return hf_config.is_directory(path)


def opened(path: str, file: str) -> Any:
    """``safe_open(file)``, or one line naming the file when it is not whole safetensors (a download
    cut short leaves a header that promises more bytes than the file holds) or is missing."""
    from safetensors import safe_open

    if not os.path.isfile(file):
        raise ValueError(
            f"{FIELD}={path!r}: {INDEX} names {os.path.basename(file)}, which the directory lacks "
            "(a download not finished?)"
        )
    try:
        return safe_open(file, "np")
    except Exception as err:  # safetensors raises its own SafetensorError, a bare Exception, on a damaged file
        raise ValueError(
            f"{FIELD}={path!r}: {file} is not whole safetensors ({' '.join(str(err).split())}); a download "
            "cut short? fetch it again"
        ) from None


def weight_files(path: str) -> dict[str, str]:
    """Each tensor's name -> the file holding it: the index's ``weight_map``, or the one file."""
    index = os.path.join(path, INDEX)
    if os.path.isfile(index):
        try:
            with open(index) as fh:
                weight_map = json.load(fh)["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{FIELD}={path!r}: {index} is no index of shards ({type(err).__name__}: {err})") from None
        return {name: os.path.join(path, file) for name, file in weight_map.items()}
    single = os.path.join(path, WEIGHTS)
    with opened(path, single) as fh:
        return dict.fromkeys(fh.keys(), single)


def header(path: str) -> dict[str, tuple[tuple[int, ...], str, str]]:
    """Each tensor's ``(shape, safetensors dtype, file)``, read from the files' headers alone; a
    missing or damaged file, or a tensor dew does not read (a quantized or integer weight), is
    refused naming it."""
    files: dict[str, list[str]] = defaultdict(list)
    for name, file in weight_files(path).items():
        files[file].append(name)
    out = {}
    for file, names in files.items():
        with opened(path, file) as fh:
            held = set(fh.keys())
            for name in names:
                if name not in held:
                    raise ValueError(f"{FIELD}={path!r}: {INDEX} puts {name} in {file}, which does not hold it")
                s = fh.get_slice(name)
                out[name] = (tuple(s.get_shape()), s.get_dtype(), file)
    for name, (_, dtype, _) in out.items():
        if dtype not in SAFETENSORS_DTYPES and not name.endswith("rotary_emb.inv_freq"):
            raise ValueError(
                f"{FIELD}={path!r}: the weights hold {name} in {dtype}; dew reads {', '.join(SAFETENSORS_DTYPES)}"
            )
    return out


def dew_shapes(run: RunConfig | TransformerFields, path: str) -> dict[str, tuple[int, ...]]:
    """The shapes the directory ``path`` gives dew's parameters (a block's with ``depth`` in front),
    after checking its config against the run's model and each tensor against the shape its config
    gives it (``check_tensors``)."""
    if not isinstance(run, hf_llama.TransformerFields) and run.model.architecture != hf_llama.ARCHITECTURE:
        raise ValueError(
            f"{FIELD}={path!r}: a Hugging Face Llama, Qwen2, Qwen3 or Mistral directory starts a "
            f"{hf_llama.ARCHITECTURE!r} run, not {run.model.architecture!r}"
        )
    f = hf_llama.fields_of(run)
    hf_llama.check_config(f, path)
    saved = header(path)
    check_tensors(f, path, saved)
    depth = sum(1 for k in saved if k.endswith(".input_layernorm.weight"))
    shapes = {}
    for key, (name, _, from_hf) in hf_llama.table(f).items():
        first = name.format(i=0)
        if first not in saved:  # a field set otherwise than config.json: warmstart.check names the parameter
            continue
        try:
            one = jax.eval_shape(from_hf, jax.ShapeDtypeStruct(saved[first][0], np.float32)).shape
        except TypeError:  # a reshape that cannot take the saved shape (the run's heads are not the directory's)
            shapes[key] = saved[first][0]
            continue
        shapes[key] = (depth, *one) if "{i}" in name else tuple(one)
    return shapes


IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
"""Tensors an older ``save_pretrained`` wrote that hold no parameter (RoPE's frequencies, recomputed)."""


def check_tensors(f: TransformerFields, path: str, saved: dict[str, tuple[tuple[int, ...], str, str]]) -> None:
    """Refuse, in one line naming the file, a tensor whose shape is not the one ``config.json``
    gives it, one the model needs and the files lack, or one it has no place for (a bias the family
    has not: the model would compute without it)."""
    config = hf_config.read_config(path)
    wanted = hf_shapes(config, path)
    for name, shape in wanted.items():
        if name not in saved:
            raise ValueError(f"{FIELD}={path!r}: the weights hold no {name} (config.json's model needs it)")
        if saved[name][0] != shape:
            raise ValueError(
                f"{FIELD}={path!r}: {saved[name][2]} holds {name} of shape {list(saved[name][0])}; "
                f"config.json gives it {list(shape)}"
            )
    for name, (_, _, file) in saved.items():
        tied_head = name == "lm_head.weight" and f.tie_embeddings  # some tied models save the head anyway
        if name not in wanted and not tied_head and not IGNORED.search(name):
            raise ValueError(
                f"{FIELD}={path!r}: {file} holds {name}, which dew's transformer has no place for "
                f"(config.json's {hf_config.family_of(config, path).architecture} has no such tensor)"
            )


def hf_shapes(config: dict[str, Any], path: str) -> dict[str, tuple[int, ...]]:
    """Every tensor a directory of this ``config.json`` holds, with the shape transformers gives it."""
    fields = hf_config.model_config(path)
    D, V, H = fields["hidden_size"], config["vocab_size"], fields["mlp_hidden"]
    hd = fields["head_dim"]
    q, kv = fields["num_heads"] * hd, fields["num_kv_heads"] * hd
    layer = {
        "input_layernorm.weight": (D,),
        "self_attn.q_proj.weight": (q, D),
        "self_attn.k_proj.weight": (kv, D),
        "self_attn.v_proj.weight": (kv, D),
        "self_attn.o_proj.weight": (D, q),
        "post_attention_layernorm.weight": (D,),
        "mlp.gate_proj.weight": (H, D),
        "mlp.up_proj.weight": (H, D),
        "mlp.down_proj.weight": (D, H),
    }
    if fields["qkv_bias"]:
        layer |= {"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)}
    if fields["qk_norm"]:
        layer |= {"self_attn.q_norm.weight": (hd,), "self_attn.k_norm.weight": (hd,)}
    out = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
    out |= {f"model.layers.{i}.{name}": shape for i in range(fields["depth"]) for name, shape in layer.items()}
    if not fields["tie_embeddings"]:
        out["lm_head.weight"] = (V, D)
    return out


def read(
    run: RunConfig | TransformerFields, path: str, target: dict[PathParts, jax.ShapeDtypeStruct]
) -> dict[PathParts, jax.Array]:
    """The Llama directory's values for ``target`` (flat ``{path: ShapeDtypeStruct}`` with
    shardings), shard by shard (the module's docstring), each cast to its target's dtype and built
    on the devices its sharding names from the slices they hold."""
    f = hf_llama.fields_of(run)
    spec, scale = hf_llama.table(f), hf_llama.factors(f)
    files = weight_files(path)
    buffers = {p: aligned_empty(want.shape, want.dtype) for p, want in target.items()}
    by_file: dict[str, list[tuple[str, PathParts, int | None]]] = defaultdict(list)
    for p in target:
        name = spec["/".join(map(str, p))][0]
        for i in range(f.depth) if "{i}" in name else [None]:
            hf_name = name.format(i=i)
            if hf_name not in files:
                raise ValueError(f"{FIELD}={path!r}: the weights hold no {hf_name}")
            by_file[files[hf_name]].append((hf_name, p, i))
    for file in sorted(by_file):
        with opened(path, file) as fh:
            for hf_name, p, i in by_file[file]:
                key = "/".join(map(str, p))
                slot = buffers[p] if i is None else buffers[p][i]
                view = spec[key][1](slot)  # Llama's layout of the slot: a view, so writes land in it
                assert np.may_share_memory(view, slot), key
                place(fh.get_tensor(hf_name), view, scale.get(key, 1.0))
    out: dict[PathParts, jax.Array] = {}
    for p, want in target.items():
        value = buffers.pop(p)
        out[p] = jax.make_array_from_callback(want.shape, want.sharding, functools.partial(_at, value))
        del value  # the host buffer goes as soon as the devices hold the parameter
    return out


ALIGNMENT = 64
"""Bytes: JAX's CPU client adopts a NumPy buffer aligned to this as a device array without copying it."""


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``np.empty(shape, dtype)`` starting on an ``ALIGNMENT``-byte boundary, so that on a CPU the
    array built from it is the buffer itself, not a second copy of the parameter."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(size + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + size].view(dtype).reshape(shape)


TILE = 128
"""Rows and columns of the tiles a transposed write goes in (``place``)."""


def place(tensor: np.ndarray, into: np.ndarray, scale: float) -> None:
    """Write the saved ``tensor`` into ``into`` (a view of a parameter's buffer in Llama's layout:
    the layouts are reshapes and transposes, so a write through it lands in dew's layout), cast to
    its dtype (NumPy's assignment casts as it copies: one pass) and divided by ``scale``.

    A matrix's write through a transposed view goes a ``TILE`` x ``TILE`` tile at a time: one pass
    over the whole matrix reads along rows and writes down columns, a cache miss per element; a
    tile's reads and writes stay in the cache. NumPy does not tile a strided copy itself; measured
    on a 4096 x 4096 bfloat16 weight cast into float32: 0.34 s in one pass, 0.066 s in tiles of 128
    (docs/performance.md)."""
    source = tensor.astype(np.float32) / np.float32(scale) if scale != 1.0 else tensor
    if into.ndim != 2 or into.flags.c_contiguous or into.size <= TILE * TILE:
        into[...] = source
        return
    rows, cols = into.shape
    for i in range(0, rows, TILE):
        for j in range(0, cols, TILE):
            into[i : i + TILE, j : j + TILE] = source[i : i + TILE, j : j + TILE]


def _at(value: np.ndarray, index: tuple[slice, ...]) -> np.ndarray:
    """The slice of ``value`` a device holds (``jax.make_array_from_callback``'s callback)."""
    return value[index]


# ----------------------------------------------------------------------------------------- out

SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
UNITS["TIB"] = 2**40


def parse_size(text: str) -> int:
    """``5GB``, ``500MB``, ``2GiB`` or a byte count -> bytes (transformers' ``max_shard_size``
    units: KB, MB, GB are powers of 1000, KiB, MiB, GiB of 1024)."""
    m = SIZE.match(text)
    if m is None or float(m.group(1)) <= 0:
        raise ValueError(f"--max-shard-size={text!r}: expected a positive size such as 5GB, 500MB or 2GiB")
    return int(float(m.group(1)) * UNITS[(m.group(2) or "B").upper()])


def shards(tensors: dict[str, np.ndarray], max_bytes: int | None) -> list[dict[str, np.ndarray]]:
    """``tensors`` in order, split where the next tensor would take a shard past ``max_bytes``
    (a tensor larger than that alone in its shard), as ``save_pretrained`` splits."""
    out: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, value in tensors.items():
        if max_bytes is not None and out[-1] and size + value.nbytes > max_bytes:
            out.append({})
            size = 0
        out[-1][name] = value
        size += value.nbytes
    return out


def write(tensors: dict[str, np.ndarray], out: str, max_bytes: int | None) -> list[str]:
    """Write ``tensors`` into the directory ``out`` as ``model.safetensors``, or, past ``max_bytes``,
    as ``model-0000i-of-0000n.safetensors`` shards with ``model.safetensors.index.json``; returns
    the files written. Each file is written under a temporary name and renamed."""
    from safetensors.numpy import save_file

    parts = shards(tensors, max_bytes)
    names = (
        [WEIGHTS]
        if len(parts) == 1
        else [f"model-{i:05d}-of-{len(parts):05d}.safetensors" for i in range(1, len(parts) + 1)]
    )
    for name, part in zip(names, parts, strict=True):
        tmp = os.path.join(out, name + ".tmp")
        save_file(part, tmp, metadata={"format": "pt"})
        os.chmod(tmp, 0o666 & ~_umask())  # safetensors makes its files its owner's alone (0600)
        os.replace(tmp, os.path.join(out, name))
    if len(parts) > 1:
        index = {
            "metadata": {"total_size": sum(v.nbytes for v in tensors.values())},
            "weight_map": {t: name for name, part in zip(names, parts, strict=True) for t in part},
        }
        with open(os.path.join(out, INDEX), "w") as fh:
            json.dump(index, fh, indent=2)
        names.append(INDEX)
    return names


def _umask() -> int:
    """The process's umask: the mode ``open`` gives a new file is 0666 less it."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def write_directory(
    f: TransformerFields,
    params: dict[str, jax.Array],
    out: str,
    *,
    dtype: str = "float32",
    max_bytes: int | None = None,
    eos_token_id: int | None = None,
) -> list[str]:
    """Write ``params`` (dew path -> array, a ``transformer`` with fields ``f``) into the existing
    directory ``out`` in Llama's layout: the weights in ``dtype`` (sharded past ``max_bytes``),
    ``config.json`` and ``generation_config.json``. Returns the files written."""
    written = write(hf_llama.tensors(f, params, DTYPES[dtype]), out, max_bytes)
    for name, record in (
        (hf_config.CONFIG, hf_llama.config_json(f, dtype=dtype, eos_token_id=eos_token_id)),
        (hf_config.GENERATION, hf_config.generation_json(eos_token_id)),
    ):
        with open(os.path.join(out, name), "w") as fh:
            json.dump(record, fh, indent=2)
        written.append(name)
    return written
