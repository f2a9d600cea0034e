"""What ``dew.compat.hydra_compositions_read_once`` saves: Hydra composing dew's config, as every
command does (twice for ``dew-train``, once more for each job a launch checks), with hydra-core's
own config repository copies and YAML parses and with dew's.

One process, the two sides interleaved composition by composition (the order alternating), each
timed by the process's CPU clock: ``hydra`` is hydra-core 1.3.8 as installed (its repository copied
whole, ConfigStore and all, and every YAML file parsed again by each composition); ``dew`` is the
same composition with the copy sharing the ConfigStore and each YAML text parsed once per process.
Both sides' composed configs are compared first, to the byte (``OmegaConf.to_yaml`` of the whole
config, Hydra's node included).

    python bench/compose.py [--rounds 40] [--overrides experiment=digits ...]

The last line printed is JSON: {"bench": "compose", "cpu_ratio": ..., "ms": {...}, ...}.
``cpu_ratio`` is the median ``dew`` composition's CPU time over the median ``hydra`` one's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--overrides", nargs="*", default=["experiment=digits", "model.config.depth=1"])
    args = parser.parse_args(argv)

    from hydra import compose, initialize_config_dir
    from hydra._internal import config_loader_impl
    from omegaconf import OmegaConf

    from dew.commandline.configs import conf_dir, register_configs

    register_configs()  # dew's schemas, and dew's side installed (compat.hydra_compositions_read_once)
    caching = config_loader_impl.CachingConfigRepository
    dew_side = (caching.__init__, OmegaConf.load)
    hydra_side = (caching.__init__.__wrapped__, OmegaConf.load.__wrapped__)

    def use(side: tuple[Any, Any]) -> None:
        caching.__init__, load = side
        OmegaConf.load = staticmethod(load)  # type: ignore[method-assign,assignment]

    sides = {"hydra": hydra_side, "dew": dew_side}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        texts = {}
        for name, side in sides.items():
            use(side)
            config = compose(config_name="config", overrides=args.overrides, return_hydra_config=True)
            texts[name] = OmegaConf.to_yaml(config)
        if texts["dew"] != texts["hydra"]:
            raise SystemExit("the two sides composed different configs")
        for r in range(args.rounds):
            for name in list(sides) if r % 2 == 0 else list(sides)[::-1]:
                use(sides[name])
                began = time.process_time()
                compose(config_name="config", overrides=args.overrides, return_hydra_config=True)
                cpu[name].append(time.process_time() - began)
    use(dew_side)
    median = {name: statistics.median(times) for name, times in cpu.items()}
    ratios = [d / h for d, h in zip(cpu["dew"], cpu["hydra"])]
    print(
        json.dumps(
            {
                "bench": "compose",
                "overrides": args.overrides,
                "rounds": args.rounds,
                "same_config": True,
                "ms": {name: round(1000 * m, 2) for name, m in median.items()},
                "cpu_ratio": round(median["dew"] / median["hydra"], 3),
                "cpu_ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
