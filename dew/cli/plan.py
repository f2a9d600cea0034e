"""``dew-plan``: where a run's parameters land on its mesh and what each device holds, before launch.

It takes the config groups and overrides ``dew-train`` takes (``dew-plan model=dit_xl2
trainer.mesh.fsdp=4 trainer.mesh.tensor=2``) and prints ``dew.training.plan.plan``'s table: each
parameter's shape, logical axes, mesh sharding and bytes per device, then the totals (parameters,
optimizer state, EMA, an activation estimate for the configured batch). It plans for the device
count the mesh names without those devices, reads no data and writes nothing.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import hydra
from omegaconf import DictConfig, OmegaConf

from dew import compat
from dew.cli.train import report_hydra_error
from dew.commandline.configs import conf_dir, register_configs
from dew.commandline.console import console_script
from dew.commandline.exits import EXIT_BAD_INPUT
from dew.contract.typed import ConfigError
from dew.recipe import Recipe

if TYPE_CHECKING:
    from dew.training.plan import Plan


def plan_from_hydra(cfg: DictConfig) -> Plan:
    # heavy: JAX loads only once Hydra has composed the config (--help and a bad override stay quick)
    from dew.training.checkpointing.hf_config import with_checkpoint_fields
    from dew.training.plan import plan

    try:
        recipe = with_checkpoint_fields(Recipe.from_dict(OmegaConf.to_container(cfg, resolve=True)))
        result = plan(recipe)
    except (ConfigError, ValueError) as err:
        print(f"dew-plan: error: {err}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    print(result.table(), flush=True)
    return result


@console_script
def main() -> None:
    register_configs()
    with compat.hydra_reports(report_hydra_error):
        hydra.main(version_base="1.3", config_path=conf_dir(), config_name="config")(plan_from_hydra)()


if __name__ == "__main__":
    main()
