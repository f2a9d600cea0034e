"""What dew's local launcher (``hydra/launcher=local``: submitit's local executor, every job's tasks
processes on this machine) adds to ``SubmititLaunch``.

The local executor tells every task its rank and the task count (submitit's job environment) but
names no meeting point, and all local jobs of a sweep start at once, so each job needs its own
coordinator port: the launching process picks one free port per job (``dew.launching.pool.
free_ports``) and the job's tasks read it from the pickled launcher. Concurrent jobs never collide,
and a requeued job (the same pickle) meets on the same port again.

Ctrl-C in the terminal reaches every process of the group. The controllers never see it (they
start with SIGINT blocked: ``compat.submitit_local_controllers``); the tasks that already listen
save at their next step and stop; the launching process answers it with its own handler
(``dew.launching.interrupts``): it writes the sweep's stop file, which every task watches
(``watch_launcher``), so a task that was still starting stops as soon as it listens, and waits for
the jobs to end. A launcher that dies takes its jobs with it (``watch_launcher`` too).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

from dew import compat
from dew.launching.interrupts import LaunchInterrupts, for_launch
from dew.launching.jobs import SweepJob
from dew.launching.launchers import (
    SubmititLaunch,
    end_of_refused,
    end_of_stopped,
    ended_on_a_signal,
    job_process_setup,
)
from dew.launching.naming import SweepInPickle
from dew.launching.pool import free_ports
from dew.launching.sweep_lock import SWEEP_LOCK_DIR, wait_until_released

RESULT_WAIT_S = 1.0
"""How long the launching process waits for the result of a local job that ended without one (a
run stopped by a signal) before it reports the job: one look again, not submitit's 15 s
(``compat.submitit_local_results_wait``)."""

STOP_FILE = "stop"
"""In the sweep's ``.launch`` directory: written by the launching process at Ctrl-C, watched by
every task of its jobs."""


class LocalLaunch(SweepInPickle, SubmititLaunch):
    """hydra-submitit-launcher's local launcher, with dew's resolvers in the job process and one
    coordinator port per job, chosen by the launching process. Ctrl-C, at any moment, makes every
    task save at its next step and stop, while the launcher waits for them (``run_jobs``); a
    launcher that dies takes its jobs with it (``watch_launcher``). A mixin before
    hydra-submitit-launcher's ``LocalLauncher``."""

    params: dict[str, Any]
    ports: dict[int, int]
    launcher_pid: int
    stop_file: str | None = None

    def requested_devices(self) -> int | None:
        tasks = self.params.get("tasks_per_node")
        cpu_devices = int(os.environ.get("JAX_NUM_CPU_DEVICES", "1"))
        on_cpu = os.environ.get("JAX_PLATFORMS", "") == "cpu" or not self.params.get("gpus_per_node")
        known = isinstance(tasks, int) and on_cpu and "JAX_NUM_CPU_DEVICES" in os.environ
        return tasks * cpu_devices if known and isinstance(tasks, int) else None

    def requested_processes(self) -> int | None:
        tasks = self.params.get("tasks_per_node")
        return tasks if isinstance(tasks, int) else None

    def start_and_wait(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        self.ports = free_ports(len(job_overrides), first=initial_job_idx)
        self.record_sweep()
        self.launcher_pid = os.getpid()
        self.controllers: list[Any] = []
        with compat.submitit_local_controllers(self.controllers), compat.submitit_local_results_wait(RESULT_WAIT_S):
            return super().start_and_wait(job_overrides, initial_job_idx)

    def run_jobs(self, jobs: list[Any], job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        """Start the jobs and wait for them. After Ctrl-C or SIGTERM (to this process or to the
        group, at any moment: ``dew.launching.interrupts``), wait for every job to save and end, and
        end with one line per job and 130 (143 for SIGTERM)."""
        from submitit.core.utils import UncompletedJobError

        signals = for_launch()
        self.stop_file = os.path.abspath(os.path.join(str(self.config.hydra.sweep.dir), SWEEP_LOCK_DIR, STOP_FILE))
        signals.watch(self.stop_file)
        try:
            results = self.start_and_wait(job_overrides, initial_job_idx)
        except UncompletedJobError:  # submitit's report of a job that ended without a result
            if signals.received is None and not ended_on_a_signal(jobs):
                end_of_refused(jobs, self.params["submitit_folder"], self.started)
                raise  # a job that failed without stopping or refusing: submitit's report is the one to read
            results = None
        finally:
            signals.ended()
        if signals.received is not None:
            wait_until_released(jobs)
            end_of_stopped(jobs, interrupted=True, status=signals.status)
        return results

    @contextlib.contextmanager
    def refilling(self) -> Iterator[LaunchInterrupts | None]:
        """A refilled search's set-up (``dew.launching.refill``): as ``run_jobs`` and ``start_and_wait``
        set up a batch, once for the whole search; each job gets its port as it is submitted."""
        signals = for_launch()
        self.stop_file = os.path.abspath(os.path.join(str(self.config.hydra.sweep.dir), SWEEP_LOCK_DIR, STOP_FILE))
        signals.watch(self.stop_file)
        self.ports = {}
        self.record_sweep()
        self.launcher_pid = os.getpid()
        self.controllers = []
        try:
            with (
                compat.submitit_local_controllers(self.controllers),
                compat.submitit_local_results_wait(RESULT_WAIT_S),
            ):
                yield signals
        finally:
            signals.ended()

    def submit(self, executor: Any, job: SweepJob) -> Any:
        self.ports.update(free_ports(1, first=job.num))  # taken by the job's pickle, made now
        return super().submit(executor, job)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "controllers"}  # processes do not pickle

    def __call__(self, sweep_overrides: list[str], job_dir_key: str, job_num: int, *args: Any) -> Any:
        job_process_setup(args[-1])  # (job_id, singleton_state)
        self.restore_sweep()
        watch_launcher(self.launcher_pid, self.stop_file)
        os.environ["JAX_COORDINATOR_ADDRESS"] = f"127.0.0.1:{self.ports[job_num]}"
        return super().__call__(sweep_overrides, job_dir_key, job_num, *args)  # type: ignore[misc]


def watch_launcher(launcher_pid: int, stop_file: str | None = None, every_s: float = 0.5) -> None:
    """In a local job's task: stop the run at its next step boundary, with a checkpoint, once the
    launching process asks (``stop_file`` appears: SIGINT to this process, as Ctrl-C) or is gone,
    or the task's controller is (SIGTERM), so that no task outlives a killed launcher, holding its
    run's lock."""
    import signal
    import threading
    import time

    controller = os.getppid()

    def alive(pid: int) -> bool:  # a zombie (dead, not yet reaped by its parent) is gone too
        try:
            with open(f"/proc/{pid}/stat") as stat:
                return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False
        except OSError:
            return True

    def watch() -> None:
        while os.getppid() == controller and alive(launcher_pid):
            if stop_file is not None and os.path.exists(stop_file):
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(every_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="dew-watch-launcher", daemon=True).start()
