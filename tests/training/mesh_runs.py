"""A few train steps of tiny models on several meshes of 8 simulated CPU devices, in one process.

Run as ``python -m tests.training.mesh_runs OUT`` (the device count is fixed when the backend starts,
so the tests start it in a subprocess). Each run builds the state, its shardings and the step exactly
as ``dew.training.trainer.train`` does (the same functions: ``sharding.state_sharding``,
``sharding.under_rules``, ``make_train_step``), without the run directory, the journal and
evaluation, so that eight short runs fit in a test's minute. ``OUT/result.json`` holds each run's
losses and each parameter's sharding as the arrays carry it and as the rules say.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jax

from dew.launching.gc_settings import collect_less

MESHES = {"data8": (8, 1, 1), "fsdp8": (1, 8, 1), "fsdp4_tensor2": (1, 4, 2), "data2_fsdp2_tensor2": (2, 2, 2)}
"""The four meshes the issue names: (data, fsdp, tensor) sizes."""
ON = {"transformer": tuple(MESHES), "simple_dit": ("fsdp4_tensor2", "data2_fsdp2_tensor2")}
"""The meshes each architecture trains on: the transformer on all four; the DiT, whose parameters
take the same rules (one compilation a mesh, ~9 s here), on the two that split every axis, tensor
included."""

COMMON = [
    "model.dtype=float32",
    "trainer.batch_size=16",
    "trainer.steps=3",
    "trainer.compilation_cache_dir=null",
    "optim.clip_grads=0",
    "trainer.layout.min_shard_size=0",
]
TINY = "model.config={hidden_size: 32, depth: 2, num_heads: 4}"


def arch_overrides(name: str, tokens: Path) -> list[str]:
    """The transformer trains with AdamW's bf16 moments, simple_dit (flow matching on digits) with Muon.
    (The other way round compiles 1.5x longer: bf16 rounding is traced per leaf, and the DiT has twice
    the transformer's leaves.)"""
    if name == "transformer":
        return [
            "data=token_windows",
            f"data.path={tokens}",
            "data.seq_len=16",
            "data.vocab_size=64",
            "model=transformer",
            TINY,
            "optim.state_dtype=bfloat16",
        ]
    return [TINY, "optim=muon"]


def compose(*overrides: str) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from dew.commandline.configs import conf_dir, register_configs
    from dew.recipe import Recipe

    GlobalHydra.instance().clear()
    register_configs()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=list(overrides))
    return Recipe.from_dict(OmegaConf.to_container(cfg, resolve=True))


class Arch:
    """What every mesh's run of one architecture shares: the model split as ``trainer.train`` splits
    it, the optimizer, the initial state (on the host) and the step function before ``jax.jit``."""

    def __init__(self, run: Any, objective: Any, dataset: Any) -> None:
        from flax import nnx

        from dew.training import adapt, trainer
        from dew.training.step import make_train_step

        t = run.trainer
        model = adapt.build_model(run, objective)
        self.graphdef, self.params, self.rest = nnx.split(model, adapt.trainable(run.lora), ...)
        optimizer = trainer.run_optimizer(run, dataset, self.params, t.steps)
        state = trainer.TrainState.create(
            self.params,
            optimizer.tx,
            seed=t.seed,  # trainer.train's init_state
            ema=objective.ema_decay > 0,
            dynamic_scale=False,
        )
        # On the host, as NumPy arrays: each mesh's device_put is then a copy to its devices, where
        # from device 0's arrays JAX compiled a resharding program per array and mesh (1.0-1.8 CPU-s
        # a mesh, 5.5 over the six sharded runs).
        self.state = jax.device_get(state)
        self.step = make_train_step(
            objective,
            self.graphdef,
            self.rest,
            optimizer.tx,
            optimizer.learning_rate,
            accumulation=1,
            dynamic_scale=False,
        )
        self.layout, self.dataset, self.batch_size = t.layout, dataset, t.batch_size


class Run:
    """One run of ``arch`` on ``mesh``: its state laid out and its step compiled as ``trainer.train``
    does (``sharding.state_sharding``, ``sharding.under_rules``)."""

    def __init__(self, arch: Arch, mesh: Any) -> None:
        from dew.training import assembly, sharding

        self.sharding = sharding.state_sharding(arch.state, arch.params, mesh, arch.layout)
        self.state = jax.device_put(arch.state, self.sharding).replace(graphdef=arch.graphdef, rest=arch.rest)
        self.sharding = self.sharding.replace(graphdef=arch.graphdef, rest=arch.rest)
        self.batch_sharding = sharding.batch_sharding(mesh, arch.layout)
        self.step = jax.jit(
            sharding.under_rules(mesh, arch.layout, arch.step),
            in_shardings=(self.sharding, self.batch_sharding),
            out_shardings=(self.sharding, None),
            compiler_options=assembly.COMPILER_OPTIONS or None,
        )
        self.params, self.mesh, self.layout = arch.params, mesh, arch.layout
        self.iterator = arch.dataset.iterator()
        self.batch_size = arch.batch_size

    def train(self, steps: int) -> list[float]:
        losses = []
        for _ in range(steps):
            batch = jax.device_put(dict(self.iterator.next(self.batch_size)), self.batch_sharding)
            self.state, metrics = self.step(self.state, batch)
            losses.append(float(metrics["train/loss"]))
        return losses

    def specs(self) -> dict[str, list[str]]:
        """Each parameter's sharding as its array carries it, as the rules say, then its optimizer
        moments' (the leaves of the optimizer state at its path with its shape)."""
        from dew.training import sharding
        from dew.training.optim.registry import path_str

        want = sharding.param_specs(self.params, self.mesh, self.layout)
        got = {
            path_str(p)[len("params/") :]: str(x.sharding.spec)
            for p, x in jax.tree_util.tree_flatten_with_path(self.state)[0]
            if path_str(p).startswith("params/")
        }
        assert got.keys() == want.keys(), (sorted(got), sorted(want))
        moments = {}
        for p, x in jax.tree_util.tree_flatten_with_path(self.state.opt_state)[0]:
            key = next((k for k in want if path_str(p).endswith("/" + k) and x.shape == self.shape(k)), None)
            if key is not None:
                moments.setdefault(key, []).append(str(x.sharding.spec))
        return {k: [got[k], str(want[k]), *moments.get(k, [])] for k in want}

    def shape(self, key: str) -> tuple[int, ...]:
        from dew.training.optim.registry import path_str

        return next(
            tuple(x.shape) for p, x in jax.tree_util.tree_flatten_with_path(self.state.params)[0] if path_str(p) == key
        )


def main(out: Path) -> None:
    import numpy as np
    from jax.sharding import Mesh

    from dew.build import build_run
    from dew.training.checkpointing.checkpoints import Checkpoints

    out.mkdir(parents=True, exist_ok=True)
    tokens = out / "tokens.bin"
    np.random.default_rng(0).integers(0, 64, 20_000).astype(np.uint16).tofile(tokens)
    result: dict[str, Any] = {"devices": jax.device_count()}
    for name in ("transformer", "simple_dit"):
        arch = Arch(*build_run(compose(*COMMON, *arch_overrides(name, tokens))))
        one = Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
        result[f"{name}/one"] = {"losses": Run(arch, one).train(3)}
        for mesh_name in ON[name]:
            sizes = MESHES[mesh_name]
            r = Run(arch, Mesh(np.asarray(jax.devices()).reshape(sizes), ("data", "fsdp", "tensor")))
            resume = name == "transformer" and mesh_name == "fsdp4_tensor2"
            losses = r.train(2)
            if resume:  # saved on fsdp 4 x tensor 2, restored below on data 2 x fsdp 2 x tensor 2
                checkpoints = Checkpoints(out / "ck", keep=1)
                checkpoints.save(2, r.state, {"data": r.iterator.get_state()}, metrics=None)
                checkpoints.wait()
            result[f"{name}/{mesh_name}"] = {"losses": losses + r.train(1), "specs": r.specs()}
            if name == "transformer" and mesh_name == "data2_fsdp2_tensor2":
                restored, meta = checkpoints.restore(2, r.state)
                checkpoints.close()
                r.state = restored.replace(graphdef=r.state.graphdef, rest=r.state.rest)
                r.iterator.set_state(meta["data"])
                result["resumed"] = {
                    "losses": r.train(1),
                    "specs": r.specs(),
                    "mesh": dict(jax.tree.leaves(r.state.params)[0].sharding.mesh.shape),
                }
    (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    collect_less()  # a program of the suite's: collects as dew's own programs do
    jax.config.update("jax_num_cpu_devices", 8)
    main(Path(sys.argv[1]))
