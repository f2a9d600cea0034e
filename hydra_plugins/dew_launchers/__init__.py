"""dew's launchers, as Hydra plugins (Hydra instantiates launchers only from the ``hydra_plugins``
package): Hydra's basic launcher and hydra-submitit-launcher's SLURM and local launchers, each of
which checks every job of a sweep before it starts any, plus what a dew job needs in its own
process. ``launch/hydra/launcher/{dew_basic,slurm,local}.yaml`` select them; ``dew_basic`` is dew's
default.

The classes are thin: what they do is dew's launching package, the mixins before each library
class: ``dew.launching.launchers`` (what every launcher does with a sweep's job list),
``dew.launching.local_launcher`` (one coordinator port per job, Ctrl-C passed on) and
``dew.launching.slurm_launcher`` (what real sites need, ``dry_run``). A submitit job runs in a
fresh Python process that unpickles the launcher and composes the job's config again there: dew's
OmegaConf resolvers and the sweep's record (``dew.launching.naming``) are restored there.
"""

from dataclasses import dataclass
from typing import Optional

from hydra.core.config_store import ConfigStore

from dew import compat
from dew.launching.launchers import CheckedLaunch
from dew.launching.local_launcher import LocalLaunch
from dew.launching.slurm_launcher import SlurmLaunch
from hydra_plugins.hydra_submitit_launcher import config, submitit_launcher


class BasicLauncher(CheckedLaunch, compat.hydra_basic_launcher()):  # type: ignore[misc]  # Hydra's, via compat
    """Hydra's basic launcher (the jobs one after another, in this process), every job checked
    before the first starts: dew's default launcher (conf/config.yaml)."""


@dataclass
class DewSlurmConf(config.SlurmQueueConf):
    """The ``slurm`` profile's fields: hydra-submitit-launcher's, and dew's additions
    (``dew.launching.slurm_launcher.slurm_parameters`` reads them)."""

    _target_: str = "hydra_plugins.dew_launchers.SlurmLauncher"
    tasks_per_node: Optional[int] = None  # noqa: UP045 - OmegaConf reads Optional
    """Processes per node; None: one per GPU (``gpus_per_node``, or the count in ``gres``), 1 without GPUs."""
    name: Optional[str] = None  # noqa: UP045
    """The SLURM job's name; None: the sweep directory's (``<trainer.name>-sweep-<digest>``)."""
    wckey: Optional[str] = None  # noqa: UP045
    """``--wckey``, emitted only when set (sites that enforce wckeys reject a made-up one)."""
    requeue: bool = True
    """``--requeue`` (false: ``--no-requeue``): sites with ``JobRequeue=0`` refuse a preempted or
    timed-out job's ``scontrol requeue`` unless the job asked for it."""
    srun_args: Optional[list[str]] = None  # noqa: UP045
    """Arguments for ``srun`` in the batch script, e.g. pyxis's ``--container-image=...``."""
    dry_run: bool = False
    """Print the batch script that would be submitted, and submit nothing."""


ConfigStore.instance().store(group="hydra/launcher", name="dew_slurm_schema", node=DewSlurmConf, provider="dew")


class SlurmLauncher(SlurmLaunch, submitit_launcher.SlurmLauncher):
    """hydra-submitit-launcher's SLURM launcher, dew's way (``dew.launching.slurm_launcher``)."""


class LocalLauncher(LocalLaunch, submitit_launcher.LocalLauncher):
    """hydra-submitit-launcher's local launcher, dew's way (``dew.launching.local_launcher``)."""
