"""dew-eval across processes: each process reads its own records, so a mesh that puts one row of the
batch on two processes' devices is refused (it would evaluate a mixture, silently: measured, two
processes on ``trainer.mesh.data=1 trainer.mesh.tensor=2`` gave 2.8119 for a loss of 2.8097)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace


@dataclasses.dataclass(frozen=True)
class Device:
    id: int
    process_index: int


def _sharding(rows_by_device: dict[Device, tuple[int, int]], mesh: dict[str, int]) -> SimpleNamespace:
    """What ``shared_rows`` reads of a ``NamedSharding``: where each device's rows of the batch are."""
    return SimpleNamespace(
        devices_indices_map=lambda shape: {d: (slice(a, b),) for d, (a, b) in rows_by_device.items()},
        mesh=SimpleNamespace(shape=mesh),
        spec=(("data", "fsdp"),),
    )


def test_rows_on_two_processes_are_refused_naming_the_mesh():
    from dew.training.sharding import shared_rows

    # Two processes of one device each, the batch split over both (data=2): each holds its own half.
    split = _sharding({Device(0, 0): (0, 4), Device(1, 1): (4, 8)}, {"data": 2, "fsdp": 1, "tensor": 1})
    assert shared_rows(split, 8) is None
    # tensor=2 over the two processes: the whole batch on both, each filling it with its own records.
    replicated = _sharding({Device(0, 0): (0, 8), Device(1, 1): (0, 8)}, {"data": 1, "fsdp": 1, "tensor": 2})
    problem = shared_rows(replicated, 8)
    assert problem is not None and "trainer.mesh={'data': 1, 'fsdp': 1, 'tensor': 2}" in problem
    assert "processes [0, 1]" in problem and "data x fsdp (1 devices)" in problem
    # Two devices of one process sharing rows (tensor within the process) is fine.
    within = _sharding({Device(0, 0): (0, 8), Device(1, 0): (0, 8)}, {"data": 1, "fsdp": 1, "tensor": 2})
    assert shared_rows(within, 8) is None


def test_a_training_run_refuses_such_a_mesh_before_it_starts(monkeypatch):
    """dew-train feeds its batches as dew-eval does (each process its own records): the same mesh
    is refused by the run's checks, before anything is written, not trained on a mixture."""
    import pytest

    from dew.build import build_run
    from dew.training import setup, sharding
    from tests.training.conftest import compose

    run, objective, dataset = build_run(compose("trainer.steps=2"))
    assert setup.check(run, objective, dataset)[0] == 2  # one process here: its mesh passes
    replicated = _sharding({Device(0, 0): (0, 32), Device(1, 1): (0, 32)}, {"data": 1, "fsdp": 1, "tensor": 2})
    monkeypatch.setattr(sharding, "batch_sharding", lambda mesh, layout: replicated)
    with pytest.raises(ValueError, match=r"processes \[0, 1\] hold the same rows"):
        setup.check(run, objective, dataset)
