"""Where a process stands in a SLURM job (dew/launching/slurm.py), for each layout, from the variables
SLURM sets there: inside an srun step or not, and which GPUs are each task's on a node of 8."""

from __future__ import annotations

import pytest

from dew.launching.slurm import local_device_ids, outside_step, step_tasks, tasks_per_node

JOB = {
    "SLURM_JOB_ID": "77",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_NODELIST": "gpu[01-02]",
    "SLURM_NTASKS": "16",
    "SLURM_TASKS_PER_NODE": "8(x2)",
    "SLURM_GPUS_ON_NODE": "8",
}


def task(rank: int, per_node: int, visible: str, **extra: str) -> dict[str, str]:
    """The variables of task ``rank`` of an srun step of 2 nodes x ``per_node`` tasks."""
    node, local = divmod(rank, per_node)
    return {
        **JOB,
        "SLURM_NTASKS": str(2 * per_node),
        "SLURM_TASKS_PER_NODE": f"{per_node}(x2)",
        "SLURM_STEP_ID": "0",
        "SLURM_STEPID": "0",
        "SLURM_STEP_NUM_TASKS": str(2 * per_node),
        "SLURM_STEP_TASKS_PER_NODE": f"{per_node}(x2)",
        "SLURM_STEP_NODELIST": "gpu[01-02]",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(local),
        "SLURM_NODEID": str(node),
        "CUDA_VISIBLE_DEVICES": visible,
        **extra,
    }


def test_inside_an_srun_step_is_known_by_the_steps_own_variables():
    assert step_tasks(task(3, 8, "0,1,2,3,4,5,6,7")) == 16
    batch = {**JOB, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}  # the batch script
    salloc = {**batch, "SLURM_STEP_ID": "4294967290", "SLURM_STEP_NUM_TASKS": "1"}  # salloc's interactive step
    for env in (batch, salloc):
        assert step_tasks(env) == 0
        assert outside_step(env) == "this process runs in SLURM job 77 of 16 tasks but outside an srun step"
    assert outside_step(task(0, 8, "0")) is None and outside_step({}) is None
    assert outside_step({**batch, "SLURM_NTASKS": "1"}) is None  # a job of one task: nothing to miss
    assert step_tasks({"SLURM_NTASKS": "8"}) == 0  # SLURM_NTASKS alone is no step


def test_task_counts_in_slurms_compressed_form():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1] and tasks_per_node("8") == [8]
    with pytest.raises(ValueError, match="SLURM_STEP_TASKS_PER_NODE='2x3'"):
        tasks_per_node("2x3")


@pytest.mark.parametrize(
    ("layout", "per_node", "visible", "extra", "expected"),
    [
        (
            "one task per GPU (--gpus-per-node=8, --ntasks-per-node=8)",
            8,
            "0,1,2,3,4,5,6,7",
            {},
            {0: [0], 3: [3], 8: [0], 13: [5]},
        ),
        (
            "one task per node (--gpus-per-node=8, --ntasks-per-node=1)",
            1,
            "0,1,2,3,4,5,6,7",
            {},
            {0: list(range(8)), 1: list(range(8))},
        ),
        (
            "--gres=gpu:8, 2 tasks per node: 4 GPUs each",
            2,
            "0,1,2,3,4,5,6,7",
            {},
            {0: [0, 1, 2, 3], 1: [4, 5, 6, 7], 3: [4, 5, 6, 7]},
        ),
        ("--gpus-per-task=1: each task sees its own GPU, numbered 0", 8, "0", {}, {0: [0], 3: [0], 15: [0]}),
        ("--gpus-per-task=2", 4, "0,1", {}, {0: [0, 1], 3: [0, 1]}),
        ("--gpu-bind=single:1 without device cgroups: the GPU keeps its number", 8, "3", {}, {3: [0]}),
        ("an older SLURM without SLURM_GPUS_ON_NODE, --gpu-bind", 8, "0", {"SLURM_GPUS_ON_NODE": ""}, {5: [0]}),
    ],
)
def test_each_task_uses_its_own_gpus(layout, per_node, visible, extra, expected):
    for rank, devices in expected.items():
        env = task(rank, per_node, visible, **extra)
        assert local_device_ids(env) == devices, (layout, rank)


def test_no_gpus_leaves_the_choice_to_jax_and_an_uneven_split_is_refused():
    assert local_device_ids(task(0, 2, "")) is None and local_device_ids({}) is None
    with pytest.raises(ValueError, match=r"CUDA_VISIBLE_DEVICES='0,1,2' shows 3 GPUs to each of the 2 tasks on node 0"):
        local_device_ids(task(1, 2, "0,1,2", SLURM_GPUS_ON_NODE="3"))
