"""The library internals dew reaches into (dew/compat.py) are still where it expects them.

A failure here names the dependency update that moved one: read dew/compat.py's entry for it."""

from __future__ import annotations

import inspect
import subprocess
import sys

from dew import compat


def test_jax_backends_started_turns_true_when_a_backend_opens():
    code = ("from dew import compat; import jax; a = compat.jax_backends_started(); jax.devices(); "
            "print(a, compat.jax_backends_started())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"JAX_PLATFORMS": "cpu", "PATH": ""}).stdout.split()
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


def test_submitit_internals_dew_uses_are_where_it_expects_them():
    import signal

    from submitit.core.job_environment import SignalHandler
    from submitit.local import local

    assert compat.submitit_usr_sig() == signal.SIGUSR2
    handler = SignalHandler.__new__(SignalHandler)
    assert compat.submitit_requeue_handler(handler.checkpoint_and_try_requeue)
    assert not compat.submitit_requeue_handler(signal.default_int_handler)
    # The local executor starts each job's controller through the module global dew patches.
    assert "start_controller(" in inspect.getsource(local.LocalExecutor._submit_command)
    original = local.start_controller
    with compat.submitit_local_controllers([]):
        assert local.start_controller is not original
    assert local.start_controller is original
