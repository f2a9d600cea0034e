"""What dew's local launcher (``hydra/launcher=local``: submitit's local executor, every job's tasks
processes on this machine) adds to ``SubmititLaunch``.

The local executor tells every task its rank and the task count (submitit's job environment) but
names no meeting point, and all local jobs of a sweep start at once, so each job needs its own
coordinator port: the launching process picks one free port per job (``dew.launching.pool.
free_ports``) and the job's tasks read it from the pickled launcher. Concurrent jobs never collide,
and a requeued job (the same pickle) meets on the same port again. Ctrl-C in the terminal reaches
the tasks, which save and stop, while the launcher passes it on and waits for them
(``wait_for_controllers``); a launcher that dies takes its jobs with it (``watch_launcher``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from dew.launching.launchers import SubmititLaunch, job_process_setup
from dew.launching.naming import SweepInPickle


class LocalLaunch(SweepInPickle, SubmititLaunch):
    """hydra-submitit-launcher's local launcher, with dew's resolvers in the job process and one
    coordinator port per job, chosen by the launching process. Ctrl-C in the terminal reaches the
    tasks, which save and stop, while the launcher waits for them (``interrupted``); a launcher
    that dies takes its jobs with it (``watch_launcher``). A mixin before
    hydra-submitit-launcher's ``LocalLauncher``."""

    params: dict[str, Any]
    ports: dict[int, int]
    launcher_pid: int

    def requested_devices(self) -> int | None:
        tasks = self.params.get("tasks_per_node")
        cpu_devices = int(os.environ.get("JAX_NUM_CPU_DEVICES", "1"))
        on_cpu = os.environ.get("JAX_PLATFORMS", "") == "cpu" or not self.params.get("gpus_per_node")
        known = isinstance(tasks, int) and on_cpu and "JAX_NUM_CPU_DEVICES" in os.environ
        return tasks * cpu_devices if known else None

    def start_and_wait(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        from dew import compat
        from dew.launching.pool import free_ports

        self.ports = free_ports(len(job_overrides), first=initial_job_idx)
        self.record_sweep()
        self.launcher_pid = os.getpid()
        self.controllers: list[Any] = []
        with compat.submitit_local_controllers(self.controllers):
            return super().start_and_wait(job_overrides, initial_job_idx)

    def interrupted(self) -> bool:
        wait_for_controllers(self.controllers)
        return True

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "controllers"}  # processes do not pickle

    def __call__(self, sweep_overrides: list[str], job_dir_key: str, job_num: int, *args: Any) -> Any:
        job_process_setup()
        self.restore_sweep()
        watch_launcher(self.launcher_pid)
        os.environ["JAX_COORDINATOR_ADDRESS"] = f"127.0.0.1:{self.ports[job_num]}"
        return super().__call__(sweep_overrides, job_dir_key, job_num, *args)  # type: ignore[misc]


def wait_for_controllers(controllers: Sequence[Any]) -> None:
    """After Ctrl-C: the tasks of every local job got it from the terminal (their controllers
    ignore it: ``compat.submitit_local_controllers``); pass it on as SIGTERM, which each controller
    forwards to its tasks (for a launcher interrupted alone; a task already stopping takes no
    notice), and wait until every job has saved and ended. Ctrl-C again only tells the tasks to
    stop at once (the terminal sends it to them); this process waits still."""
    import signal
    import time

    for process in controllers:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    while any(p.poll() is None for p in controllers):
        try:
            time.sleep(0.1)
        except KeyboardInterrupt:
            continue


def watch_launcher(launcher_pid: int, every_s: float = 1.0) -> None:
    """In a local job's task: stop the run (SIGTERM to this process: it saves at the next step
    boundary and ends) once the process that launched it, or the task's controller, is gone, so
    that no task outlives a killed launcher, holding its run's lock."""
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
            time.sleep(every_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="dew-watch-launcher", daemon=True).start()
