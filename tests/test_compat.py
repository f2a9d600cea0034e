"""The library internals dew reaches into (dew/compat.py) are still where it expects them.

A failure here names the dependency update that moved one: read dew/compat.py's entry for it."""

from __future__ import annotations

import dataclasses
import inspect
import json
import subprocess
import sys
from typing import Literal

import pytest
import tyro

from dew import compat


def test_jax_backends_started_turns_true_when_a_backend_opens():
    code = (
        "from dew import compat; import jax; a = compat.jax_backends_started(); jax.devices(); "
        "print(a, compat.jax_backends_started())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"JAX_PLATFORMS": "cpu", "PATH": ""},
    ).stdout.split()
    assert out == ["False", "True"]


def test_jax_distributed_client_is_none_outside_a_pool():
    assert compat.jax_distributed_client() is None


def test_qwix_flax_util_has_what_quantization_uses():
    flax_util = compat.qwix_flax_util()
    for name in ("find_param", "get_current_module", "unbox"):
        assert callable(getattr(flax_util, name)), name
    assert list(inspect.signature(flax_util.find_param).parameters)[:2] == ["x", "ptq_array_type"]


def test_qwix_find_param_patch_is_seen_and_restored():
    flax_util = compat.qwix_flax_util()
    original = flax_util.find_param
    with compat.qwix_find_param(lambda x, ptq_array_type=None: "kernel"):
        assert compat.qwix_flax_util().find_param(object()) == "kernel"
    assert flax_util.find_param is original


def test_qwix_qt_provider_private_methods_exist():
    import qwix

    methods = compat.qwix_qt_provider_private()
    assert set(methods) == set(compat.QT_PROVIDER_PRIVATE)
    assert all(callable(m) for m in methods.values())
    # the public matmuls that dew's quantized LoRA borrows call them
    source = inspect.getsource(qwix.QtProvider)
    for name in compat.QT_PROVIDER_PRIVATE:
        assert f"self.{name}" in source, name


def _restore_that_fails_with_a_read_in_flight(run_sync) -> tuple[list, list]:
    """What a damaged checkpoint does to orbax's restore: one read fails while another (a tensorstore
    future, completed by tensorstore's thread a moment later) is still in flight. (reads that
    finished, unraisable exceptions printed)."""
    import asyncio
    import threading
    import time

    import tensorstore as ts

    promise, future = ts.Promise.new()
    finished, unraisable = [], []

    async def other_read():
        finished.append(await future)

    async def restore():
        asyncio.get_running_loop().create_task(other_read())
        await asyncio.sleep(0)
        raise ValueError("OUT_OF_RANGE: a cut-short array")

    hook = sys.unraisablehook
    sys.unraisablehook = lambda u: unraisable.append(repr(u.exc_value))
    try:
        threading.Timer(0.2, promise.set_result, args=(7,)).start()
        try:
            run_sync(restore())
        except ValueError:
            pass
        time.sleep(0.5)  # the other read completes, into whatever loop is left
    finally:
        sys.unraisablehook = hook
    return finished, unraisable


def test_orbax_reads_settle_before_the_loop_closes():
    from orbax.checkpoint._src import asyncio_utils

    original = asyncio_utils._run_sync_via_new_loop
    with compat.orbax_reads_settle():
        assert asyncio_utils._run_sync_via_new_loop is not original
        assert _restore_that_fails_with_a_read_in_flight(asyncio_utils.run_sync) == ([7], [])
    assert asyncio_utils._run_sync_via_new_loop is original
    # what the patch mends: orbax closes the loop under the read ("Event loop is closed")
    finished, unraisable = _restore_that_fails_with_a_read_in_flight(asyncio_utils.run_sync)
    assert finished == [] and unraisable == ["RuntimeError('Event loop is closed')"]


def test_orbax_restores_run_through_run_sync():
    """The orbax calls dew's restores make go through ``asyncio_utils.run_sync``, which runs the
    loop ``orbax_reads_settle`` replaces."""
    from orbax.checkpoint._src import asyncio_utils
    from orbax.checkpoint._src.handlers import base_pytree_checkpoint_handler as handler

    assert "asyncio_utils.run_sync(" in inspect.getsource(handler.BasePyTreeCheckpointHandler.restore)
    assert "_run_sync_via_new_loop(" in inspect.getsource(asyncio_utils.run_sync)


def test_orbax_standard_handler_delegates_to_a_pytree_handler_it_builds_with_its_own_defaults():
    """``orbax_uncompressed_standard_handler`` replaces ``StandardCheckpointHandler._impl`` with a
    ``PyTreeCheckpointHandler`` built from the standard handler's defaults: that attribute must still
    be where every save and restore goes, and each default a PyTree handler's parameter."""
    import orbax.checkpoint as ocp
    from orbax.checkpoint._src.handlers import standard_checkpoint_handler as standard

    assert isinstance(ocp.StandardCheckpointHandler()._impl, ocp.PyTreeCheckpointHandler)
    for method in (standard.StandardCheckpointHandler.async_save, standard.StandardCheckpointHandler.restore):
        assert "self._impl." in inspect.getsource(method), method.__name__
    params = set(inspect.signature(ocp.StandardCheckpointHandler).parameters)
    assert params <= set(inspect.signature(ocp.PyTreeCheckpointHandler).parameters) - {"use_compression"}
    handler = compat.orbax_uncompressed_standard_handler()
    assert isinstance(handler, ocp.StandardCheckpointHandler) and isinstance(handler._impl, ocp.PyTreeCheckpointHandler)


def test_hydra_args_parser_reads_overrides_and_flags():
    args, unknown = compat.hydra_args_parser().parse_known_args(["-m", "trainer.steps=3", "model=dit", "--cfg", "job"])
    assert (args.overrides, args.multirun, args.cfg, unknown) == (["trainer.steps=3", "model=dit"], True, "job", [])


def test_hydra_apply_overrides_sets_adds_and_deletes_as_hydra_does():
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import ConfigCompositionException
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"a": {"b": 1, "c": {"d": 2}}, "e": 7})
    OmegaConf.set_struct(cfg, True)
    parsed = OverridesParser.create().parse_overrides(["a.b=3", "+a.f=[1,2]", "++a.c.d=5", "~e", "a.c={d: 6}"])
    compat.hydra_apply_overrides(parsed, cfg)
    assert OmegaConf.to_container(cfg) == {"a": {"b": 3, "c": {"d": 6}, "f": [1, 2]}}
    for refused in ("a.nope=1", "+a.b=1", "~nope"):  # absent; a null value too, by Hydra's rule
        with pytest.raises(ConfigCompositionException):
            compat.hydra_apply_overrides(OverridesParser.create().parse_overrides([refused]), cfg)


def test_submitit_requeue_signal_is_the_preemption_signal():
    import signal

    from submitit.core.job_environment import JobEnvironment
    from submitit.slurm.slurm import SlurmJobEnvironment

    assert compat.submitit_requeue_signal() == compat.submitit_requeue_signal(SlurmJobEnvironment) == signal.SIGUSR2

    class Usr1(JobEnvironment):  # what SUBMITIT_PREEMPT_SIGNAL=USR1 sets, read by the same method
        USR_SIG = "USR1"

    assert compat.submitit_requeue_signal(Usr1) == signal.SIGUSR1


def test_qwix_convert_rules_sees_each_rule_after_the_base_prepared_it():
    import qwix

    seen = []

    class Provider(qwix.QtProvider):
        pass

    compat.qwix_convert_rules(Provider, lambda rule: seen.append(rule) or "converted")
    # QtProvider's own preparation turns a plain rule into a QtRule before convert sees it
    provider = Provider([qwix.QtRule(module_path="a", weight_qtype="int8"), qwix.QuantizationRule(module_path="b")])
    assert [r.module_path for r in seen] == ["a", "b"] and all(isinstance(r, qwix.QtRule) for r in seen)
    assert provider._rules == ["converted", "converted"]  # what qwix's matmuls then read


def test_xla_cpu_client_child_refuses_an_unknown_flag():
    import os

    import jaxlib._jax

    assert callable(jaxlib._jax.get_tfrt_cpu_client)  # the fast path, not the fallback
    env = {**os.environ, "XLA_FLAGS": "--xla_no_such_flag=1", "TF_CPP_MIN_LOG_LEVEL": "0", "JAX_PLATFORMS": "cpu"}
    child = subprocess.run(
        [sys.executable, "-c", compat.XLA_CPU_CLIENT_CHILD], env=env, capture_output=True, text=True, timeout=120
    )
    assert child.returncode != 0 and "Unknown flag" in child.stderr and "xla_no_such_flag" in child.stderr
    env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"
    assert subprocess.run([sys.executable, "-c", compat.XLA_CPU_CLIENT_CHILD], env=env, timeout=120).returncode == 0


def test_submitit_sbatch_script_is_the_executors_and_names_map():
    names = compat.submitit_slurm_parameter_names()
    assert (names["timeout_min"], names["tasks_per_node"], names["name"]) == ("time", "ntasks_per_node", "job_name")
    script = compat.submitit_sbatch_script(
        "/f/%j",
        "python -m x",
        nodes=2,
        ntasks_per_node=4,
        wckey=None,
        job_name="run",
        additional_parameters={"requeue": True},
    )
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=4" in script and "#SBATCH --requeue" in script
    assert "--wckey" not in script and script.rstrip().endswith("python -m x")


def test_submitit_handler_and_local_controller_dew_uses_are_where_it_expects_them():
    import signal

    from submitit.core.job_environment import SignalHandler
    from submitit.local import local

    handler = SignalHandler.__new__(SignalHandler)
    assert compat.submitit_requeue_handler(handler.checkpoint_and_try_requeue)
    assert not compat.submitit_requeue_handler(signal.default_int_handler)
    # The local executor starts each job's controller through the module global dew patches.
    assert "start_controller(" in inspect.getsource(local.LocalExecutor._submit_command)
    original = local.start_controller
    with compat.submitit_local_controllers([]):
        assert local.start_controller is not original
    assert local.start_controller is original


def test_hydra_basic_launcher_is_hydras_default():
    from hydra.plugins.launcher import Launcher

    launcher = compat.hydra_basic_launcher()
    assert issubclass(launcher, Launcher) and launcher.__name__ == "BasicLauncher"


def test_optuna_trial_is_the_running_trial_of_that_number(tmp_path):
    """``optuna_trial`` finds a running trial by its number (as ``Study.tell`` does) and sets its
    attributes, in the storage dew's studies use."""
    import optuna

    from dew.runs.study_storage import journal

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=journal(str(tmp_path / "study.journal")))
    first, second = study.ask(), study.ask()
    study.tell(first, 1.0)
    compat.optuna_trial(study, second.number).set_user_attr("why", "because")
    study.tell(second.number, state=optuna.trial.TrialState.FAIL)
    assert [(t.number, t.state.name, t.user_attrs) for t in study.trials] == [
        (0, "COMPLETE", {}),
        (1, "FAIL", {"why": "because"}),
    ]


@dataclasses.dataclass(frozen=True)
class TyroArgs:
    mode: Literal["a", "b"] = "a"
    count: int = 1


def test_tyro_parse_errors_hand_a_rejected_command_line_over_as_one_line():
    lines: list[str] = []

    def report(line: str):
        lines.append(line)
        raise LookupError(line)

    for args in (["--mode", "c"], ["--count", "x"], ["--cuont", "2"]):
        with pytest.raises(LookupError), compat.tyro_parse_errors(report):
            tyro.cli(TyroArgs, args=args)
    assert lines == [
        "--mode: 'c' is not one of a, b",
        "--count: 'x' is not an integer",
        f"unrecognized --cuont 2 ({lines[2].split('(')[1].split(' --help')[0]} --help lists the options)",
    ]


def test_submitit_local_results_wait_reports_a_job_without_a_result_at_once(tmp_path):
    """A local job that is done without a result file raises submitit's UncompletedJobError after
    the wait given (1 s here), not after submitit's own 15 s; outside, submitit's wait is back."""
    import time

    from submitit.core.utils import UncompletedJobError
    from submitit.local import local

    job = local.LocalJob(tmp_path, "1")  # no task ever writes 1_0_result.pkl
    with compat.submitit_local_results_wait(1.0):
        assert job._results_timeout_s == 1.0
        began = time.monotonic()
        with pytest.raises(UncompletedJobError, match="has not produced any output"):
            job._get_outcome_and_result()
        waited = time.monotonic() - began
    assert waited < 10, waited  # submitit's own wait is 15 s
    assert local.LocalJob._results_timeout_s == 15 and "_results_timeout_s" not in vars(local.LocalJob)


def test_submitit_job_number_reads_hydra_s_job_number_from_the_submission(tmp_path):
    """hydra-submitit-launcher submits ``launcher(overrides, sweep-dir key, job number, id, state)``:
    the third argument is the number (the launch test reads it back from a real job's folder)."""
    from submitit.core.utils import DelayedSubmission

    DelayedSubmission(print, ["a=1"], "hydra.sweep.dir", 7, "job_id_for_7", {}).dump(tmp_path / "7_submitted.pkl")
    (tmp_path / "bad_submitted.pkl").write_bytes(b"not a pickle")
    assert compat.submitit_job_number(str(tmp_path / "7_submitted.pkl")) == 7
    assert compat.submitit_job_number(str(tmp_path / "bad_submitted.pkl")) is None


def test_a_schema_twin_pickled_by_value_keeps_its_default_factories():
    """A submitit job carries Hydra's schema twins (made at run time) by value: in the job's
    process a list of hooks must still compose (``trainer.hooks=[...]`` under a launcher)."""
    import cloudpickle

    from dew.commandline.schema import schema_of
    from dew.contract.config import HookSpec

    job = (
        "import json, pickle, sys; from omegaconf import OmegaConf; twin = pickle.loads(sys.stdin.buffer.read()); "
        "node = OmegaConf.merge(OmegaConf.structured(twin), {'name': 'loss_ema', 'options': {'decay': 0.9}}); "
        "print(json.dumps(OmegaConf.to_container(node)))"
    )  # another process, as the job's: in this one cloudpickle hands back the class it pickled
    done = subprocess.run(
        [sys.executable, "-c", job], input=cloudpickle.dumps(schema_of(HookSpec)), capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert json.loads(done.stdout) == {"name": "loss_ema", "every": 1, "options": {"decay": 0.9}}


def test_hydra_groups_listed_once_lists_what_hydra_lists_from_one_copy_of_the_repository(monkeypatch):
    """``--help`` and ``--hydra-help`` list every config group and its options: inside
    ``hydra_groups_listed_once`` the listing is Hydra's own, character for character, made from
    one copy of the config repository where Hydra makes one for each group's listings."""
    from hydra import initialize_config_dir
    from hydra._internal.config_repository import CachingConfigRepository
    from hydra.core.global_hydra import GlobalHydra

    from dew.commandline.configs import conf_dir, register_configs

    register_configs()  # first: it replaces CachingConfigRepository.__init__ once per process
    copies = []
    made = CachingConfigRepository.__init__

    def counted(self, delegate):
        copies.append(delegate)
        made(self, delegate)

    monkeypatch.setattr(CachingConfigRepository, "__init__", counted)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        listed = hydra.format_config_groups(lambda group: True)
        by_hydra = len(copies)
        with compat.hydra_groups_listed_once():
            once = hydra.format_config_groups(lambda group: True)
    GlobalHydra.instance().clear()
    assert once == listed and "optim/schedule: cosine, linear, power" in listed and "hydra/launcher: " in listed
    assert by_hydra > 50 and len(copies) - by_hydra == 1


def test_hydra_compositions_read_once_compose_what_hydra_composes_without_copying_the_store(tmp_path):
    """Each composition's copy of the config repository shares the ConfigStore (its sources' own
    search path still set on the copy alone), and ``OmegaConf.load`` parses a text once per
    process: the composed configs are Hydra's own to the byte, for the presets, a launcher and a
    sweeper, and a YAML file changed between two compositions is read as it now is."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.config_loader_impl import CachingConfigRepository
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from dew.commandline.configs import conf_dir, register_configs

    register_configs()
    ours, load = CachingConfigRepository.__init__, OmegaConf.load
    hydras = (ours.__wrapped__, load.__wrapped__)

    def composed(init, loader, overrides, config_dir=None):
        CachingConfigRepository.__init__, OmegaConf.load = init, staticmethod(loader)
        try:
            GlobalHydra.instance().clear()
            with initialize_config_dir(config_dir=str(config_dir or conf_dir()), version_base="1.3"):
                return OmegaConf.to_yaml(compose(config_name="config", overrides=overrides, return_hydra_config=True))
        finally:
            CachingConfigRepository.__init__, OmegaConf.load = ours, staticmethod(load)
            GlobalHydra.instance().clear()

    for overrides in (
        ["experiment=digits"],
        ["experiment=tiny_lm", "trainer.steps=3"],
        ["hydra/launcher=local", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=3"],
    ):
        twice = [composed(ours, load, overrides), composed(ours, load, overrides)]
        assert twice == [composed(*hydras, overrides)] * 2, overrides

    # The copy: the store itself, the sources a list of the copy's own.
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        repository = GlobalHydra.instance().config_loader().repository
        copy = CachingConfigRepository(repository)
    GlobalHydra.instance().clear()
    assert copy.delegate.sources is not repository.sources
    assert copy.delegate.get_schema_source().store is ConfigStore.instance()

    own = tmp_path / "conf"  # a config edited between two compositions in one process
    own.mkdir()
    (own / "config.yaml").write_text("defaults:\n  - dew_run\n  - _self_\ntrainer:\n  steps: 7\n")
    first = composed(ours, load, [], own)
    (own / "config.yaml").write_text("defaults:\n  - dew_run\n  - _self_\ntrainer:\n  steps: 8\n")
    assert "steps: 7" in first and "steps: 8" in composed(ours, load, [], own)


def test_omegaconf_load_parsed_once_gives_each_call_its_own_config_and_the_original_errors(tmp_path):
    from omegaconf import OmegaConf

    from dew.commandline.configs import register_configs

    register_configs()
    original = OmegaConf.load.__wrapped__
    good = tmp_path / "good.yaml"
    good.write_text("z: 0\na: 1\nb: [x, '${a}']\nc: ???\n")
    first = OmegaConf.load(good)
    first.a = 5
    first.b.append("y")  # a change to one call's config reaches no later call's
    with good.open() as stream, good.open() as other:
        stream.read(5)  # a stream is read from where it stands, as PyYAML reads it
        other.read(5)
        read = OmegaConf.to_yaml(OmegaConf.load(stream))
        assert read == OmegaConf.to_yaml(original(other)) == "a: 1\nb:\n- x\n- ${a}\nc: ???\n"
    assert OmegaConf.to_yaml(OmegaConf.load(good)) == OmegaConf.to_yaml(original(good))
    assert OmegaConf.load(str(good)).b[1] == 1 and OmegaConf.is_missing(OmegaConf.load(good), "c")
    for text in ("a: [1, 2\n", "a: 1\na: 2\n"):  # unparsable; a key twice (Hydra's loader refuses it)
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        errors = []
        for loader in (OmegaConf.load, original):
            with pytest.raises(Exception) as raised, bad.open() as stream:
                loader(stream)
            errors.append((type(raised.value), str(raised.value)))
        assert errors[0] == errors[1] and str(bad) in errors[0][1]
