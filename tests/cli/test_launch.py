"""launch/: the launcher profiles compose from a clone and from an installed wheel, and a SLURM job
runs the way submitit runs it (a simulated cluster: ``sbatch`` and ``srun`` stand-ins that set the
SLURM_* variables and run the job submitit pickled, here and at once)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from dew.commandline.configs import conf_dir, register_configs
from dew.recipe import Recipe
from tests.conftest import REPO, cli_env, dew
from tests.training.conftest import TINY, fast_env

LAUNCH_FILES = [
    "dew/launch/hydra/launcher/slurm.yaml",
    "dew/launch/hydra/launcher/local.yaml",
    "dew/launch/README.md",
    "hydra_plugins/dew_launchers/__init__.py",
]


def launcher(*overrides: str):
    GlobalHydra.instance().clear()
    register_configs()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=True).hydra.launcher


def test_slurm_profile_is_set_up_for_jax_and_overridable():
    slurm = launcher(
        "hydra/launcher=slurm",
        "hydra.launcher.gpus_per_node=4",
        "hydra.launcher.nodes=2",
        "hydra.launcher.partition=gpu",
        "+hydra.launcher.additional_parameters.mail-type=END",
    )
    assert slurm._target_ == "hydra_plugins.dew_launchers.SlurmLauncher"
    assert (slurm.nodes, slurm.gpus_per_node, slurm.tasks_per_node) == (2, 4, None)  # None: one task per GPU
    assert slurm.partition == "gpu" and slurm.additional_parameters == {"mail-type": "END"}
    assert slurm.signal_delay_s == 300 and slurm.max_num_timeout == 20 and list(slurm.setup) == []
    local = launcher("hydra/launcher=local")
    assert local._target_ == "hydra_plugins.dew_launchers.LocalLauncher" and local.tasks_per_node == 2


@pytest.mark.slow
def test_dew_train_shows_the_slurm_profile(workdir: Path):
    result = dew("hydra/launcher=slurm", "hydra.launcher.nodes=2", "--cfg", "hydra", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert "_target_: hydra_plugins.dew_launchers.SlurmLauncher" in result.stdout
    assert "nodes: 2" in result.stdout and "signal_delay_s: 300" in result.stdout


@pytest.mark.slow
def test_an_installed_wheel_finds_the_profiles(tmp_path: Path):
    """Build the wheel, install it alone into a fresh venv (its dependencies from this one), and
    compose the SLURM profile from a directory that holds no dew: about 40 s on two busy cores."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "wheel"),
            str(REPO),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "wheel").glob("dew-*.whl")
    assert set(LAUNCH_FILES) <= set(zipfile.ZipFile(wheel).namelist())
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    site = next(Path(p) for p in sys.path if p.endswith("site-packages"))
    (venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages" / "deps.pth").write_text(
        f"{site}\n"
    )
    subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, timeout=300
    )
    env = {k: v for k, v in cli_env().items() if k != "PYTHONPATH"}
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    result = subprocess.run(
        [venv / "bin" / "dew-train", "hydra/launcher=slurm", "--cfg", "hydra"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "_target_: hydra_plugins.dew_launchers.SlurmLauncher" in result.stdout
    where = subprocess.run(
        [venv / "bin" / "python", "-c", "import dew; print(dew.__file__)"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    assert where.startswith(str(venv))  # the wheel's dew, not this checkout's


SBATCH = """#!/bin/bash
# sbatch stand-in: say job 4242 was submitted (submitit then moves the job's pickle into place) and
# run the job script as SLURM job 4242, in the background (submitit submits one job alone, no array).
SLURM_JOB_ID=4242 nohup bash "$1" > "$(dirname "$1")/sbatch.out" 2>&1 &
echo "Submitted batch job 4242"
"""

SRUN = """#!/bin/bash
# srun stand-in: one task on one node; drop srun's own options, run the command.
while [[ "$1" == --* ]]; do case "$1" in --output|--error) shift 2;; *) shift;; esac; done
export SLURM_NTASKS=1 SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_JOB_NUM_NODES=1 \\
  SLURM_JOB_NODELIST=localhost SLURM_STEP_NODELIST=localhost
exec "$@"
"""


@pytest.mark.slow
def test_a_slurm_job_runs_as_submitit_runs_it(workdir: Path):
    bin_dir = workdir.parent / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", SBATCH), ("srun", SRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = fast_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    result = dew(
        "-m",
        "hydra/launcher=slurm",
        "hydra.launcher.gpus_per_node=1",
        *TINY,
        "trainer.steps=2",
        "trainer.eval_every=null",
        "trainer.checkpoint_dir=ck",
        "trainer.name=slurm",
        "trainer.multi_host=true",
        cwd=workdir,
        env=env,
    )
    assert result.returncode == 0, result.stderr + "".join(p.read_text() for p in workdir.rglob("sbatch.out"))
    (run,) = (p.parent for p in (workdir / "ck").rglob("run.json"))
    (sweep,) = (workdir / "ck").glob("slurm-sweep-*")  # <name>-sweep-<digest of the command>
    assert run.parent == sweep and (run / "2").is_dir() and (run / ".hydra").is_dir()
    assert Recipe.load(str(run)).trainer.multi_host is True
    log = (sweep / ".submitit" / "sbatch.out").read_text()  # what the stand-ins ran
    assert "joined the JAX process pool: process 0 of 1" in log  # jax.distributed found the SLURM job
    script = next((sweep / ".submitit").rglob("*_submission.sh")).read_text()
    assert "#SBATCH --signal=USR2@300" in script and "#SBATCH --ntasks-per-node=1" in script
