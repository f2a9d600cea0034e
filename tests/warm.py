"""dew's commands run from a warm interpreter: a process per pytest worker that imported JAX, Flax,
Optax, Orbax, Grain, Hydra and dew once, and forks a child for each command, which runs the command's
module as ``python -m MODULE ARGS`` runs it (``runpy``, ``__main__``, its own ``sys.argv``, working
directory, environment, stdin/stdout/stderr) and ends as a Python program ends (its exit status, its
atexit handlers). The child is a real process: what the command launches, locks, writes and prints
is the command's own; what it skips is the ~1.5 CPU-s of imports every cold start pays (most of a
``--check``'s time: ~200 such commands in the suite).

What a cold start would read differently is never run warm (``Server.serves``): an environment whose
import-time variables (JAX_*, XLA_*, PYTHON*, thread counts, ...) differ from the server's, a
module the server did not import. Two JAX variables are the exceptions: ``JAX_COORDINATOR_ADDRESS``,
read when the pool starts, and ``JAX_NUM_CPU_DEVICES``, read at import but used only when a backend
starts, which a child sets as the import would have (``APPLIED``). ``start`` starts a command and
returns it as a ``subprocess.Popen`` (a pid to signal, an end to wait for: a multi-process test's
ranks, a run a test kills), where ``run`` waits for the command's end. Tests of start-up itself (the
first Ctrl-C, the console's first lines, the installed scripts) start their processes cold, with
``subprocess`` directly.

Run as ``python -m tests.warm``: the server. Requests and answers are JSON lines on its
stdin/stdout; it forks a child for each request and answers each when its child ends.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# Variables a library reads when it is imported (or Python reads when it starts): a command whose
# value differs from the server's runs cold. Not XLA_FLAGS: XLA reads it when the first backend
# starts, which the server never does (checked: a child given --xla_dump_to=DIR dumps there).
AT_IMPORT = (
    "JAX_",
    "TF_",
    "PYTHON",
    "OMP_",
    "OPENBLAS_",
    "MKL_",
    "LD_",
    "CUDA",
    "TPU_",
    "TENSORSTORE",
    "DEW_NO_PLUGINS",
)
APPLIED = {"JAX_NUM_CPU_DEVICES": "jax_num_cpu_devices"}
"""JAX options JAX reads from the environment at import and uses only when a backend starts (which
the server never does): a child given another value sets the option to it before the command runs,
as a cold start's import would have, so the command runs warm (multi-process tests' ranks)."""
JAX_SETS = {"TF_CPP_MIN_LOG_LEVEL": "1", "TPU_SKIP_MDS_QUERY": "1"}
"""What JAX's import puts in the environment where it is unset (jax/__init__.py; the second on a
machine without TPUs), as a cold start's import would: an environment made before this process
imported JAX lacks them, one made after holds them, and either runs as the other."""
AT_RUN = ("JAX_COORDINATOR_ADDRESS",)
"""JAX_* variables JAX reads when the command runs (``jax.distributed.initialize``), not at import."""
MODULES = (
    "dew.cli.train",
    "dew.cli.recipe",
    "dew.cli.runs",
    "dew.cli.plan",
    "dew.cli.sample",
    "dew.cli.export",
    "dew.cli.eval",
    "dew.inference.evaluating",
    "dew.data.prepare",
)
"""The commands the server runs warm; anything else runs cold."""
PRELOAD = (
    "jax",
    "jax.numpy",
    "flax.nnx",
    "optax",
    "orbax.checkpoint",
    "grain",
    "hydra",
    "omegaconf",
    "submitit",
    "dew.build",
    "dew.training.setup",
    "dew.training.trainer",
    "dew.launching.checks",
    "dew.launching.search.trial",
    # What every run of the suite's tiny digits DiT imports after the start (the dataset, the model,
    # the objective, the trackers' registry, the MLIR dialects of the first lowering): 50 modules a
    # child imported on its own, -0.1 to -0.15 CPU-s a run with Hydra's plugins below (2.31-2.46
    # against 2.43-2.55 CPU-s, interleaved runs of 5, 2026-12-06).
    "dew.data.digits",
    "dew.models.simple_dit",
    "dew.objectives.rectified_flow",
    "dew.training.optim.adam",
    "dew.training.reporting.trackers.csv",
    "dew.training.reporting.trackers.mlflow",
    "dew.training.reporting.trackers.own",
    "dew.training.reporting.trackers.tensorboard",
    "dew.training.reporting.trackers.wandb",
    "jaxlib.mlir.dialects.mhlo",
    *MODULES,
)


# --- the server -----------------------------------------------------------------------------------


def serve() -> dict:
    """Answer requests until stdin ends; in a forked child, return the child's request."""
    for name in PRELOAD:
        __import__(name)
    # Hydra's plugin scan (it imports every hydra_plugins module on the path: dew's launchers and
    # sweepers, submitit's launcher, its own core plugins) once here, not in each child: the scan
    # reads sys.path, and a child whose PYTHON* variables differ runs cold (AT_IMPORT).
    from hydra.core.plugins import Plugins

    Plugins.instance()
    # dew's schemas in Hydra's ConfigStore, which a child then finds stored (register_configs stores
    # once per set of registered datasets, schedules and trackers): -0.06 CPU-s a run.
    from dew.commandline.configs import register_configs

    register_configs()
    # One composition of the digits experiment, whose YAML texts a child then finds parsed (dew
    # parses each text once per process: dew.compat.hydra_compositions_read_once).
    from hydra import compose, initialize_config_dir

    from dew.commandline.configs import conf_dir

    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        compose(config_name="config", overrides=["experiment=digits"], return_hydra_config=True)
    children: dict[int, tuple[str, float, float | None]] = {}  # pid: (request id, start, deadline)
    answer = sys.stdout
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    stdin = sys.stdin.fileno()
    buffer = b""
    open_ = True
    # A child's end wakes the wait below (SIGCHLD, written to a pipe by Python's wakeup fd), which
    # otherwise sleeps until a request or the nearest deadline: polling every 5 ms took 1% of a core
    # for each worker's server through the whole suite.
    woken, wake = os.pipe()
    os.set_blocking(woken, False)
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while open_ or children:
        deadlines = [deadline for _, _, deadline in children.values() if deadline is not None]
        wait = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        ready, _, _ = select.select([stdin, woken] if open_ else [woken], [], [], wait)
        if woken in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(woken, 1 << 12)
        if stdin in ready:
            chunk = os.read(stdin, 1 << 16)
            open_ = bool(chunk)
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                request = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    os.close(woken)
                    os.close(wake)
                    return request
                if request.get("started"):  # ``start``: the caller signals the child by its pid
                    answer.write(json.dumps({"id": request["id"], "pid": pid}) + "\n")
                    answer.flush()
                timeout = request.get("timeout")
                children[pid] = (
                    request["id"],
                    time.monotonic(),
                    None if timeout is None else time.monotonic() + timeout,
                )
        for pid, (rid, _, deadline) in list(children.items()):
            timed_out = deadline is not None and time.monotonic() > deadline
            if timed_out:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            done, status, usage = os.wait4(pid, 0 if timed_out else os.WNOHANG)
            if done:
                del children[pid]
                cpu = usage.ru_utime + usage.ru_stime  # the command's and its waited-for children's
                reply = {"id": rid, "status": os.waitstatus_to_exitcode(status), "timed_out": timed_out, "cpu": cpu}
                answer.write(json.dumps(reply) + "\n")
                answer.flush()
    os._exit(0)


def become(request: dict) -> None:
    """In the forked child: become ``python -m MODULE ARGS`` started in the request's directory and
    environment, with its own standard streams."""
    if request.get("session"):  # a session and process group of its own, as ``start_new_session``
        os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    if request.get("log"):  # ``2>&1 >> log``: both streams appended to one file, in their order
        os.dup2(os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), 1)
        os.dup2(1, 2)
    else:
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    import jax

    for variable, option in APPLIED.items():
        if variable in os.environ:
            jax.config.update(option, int(os.environ[variable]))
    sys.path[0] = os.getcwd()  # what ``python -m`` puts first
    sys.argv = [request["module"], *request["args"]]
    import runpy
    import warnings

    # The module was imported here already (the server's preload), never in a cold start: runpy says so.
    warnings.filterwarnings("ignore", "'.*' found in sys.modules after import of package", RuntimeWarning)
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


# --- the client (a pytest worker) -----------------------------------------------------------------


class Server:
    """One warm server for this process, started at the first command; cold runs where it cannot serve."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.warm"],
            cwd=Path(__file__).resolve().parent.parent,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lock = threading.Lock()
        self.waiting: dict[str, tuple[threading.Event, dict]] = {}
        self.started: dict[str, tuple[threading.Event, dict]] = {}
        self.ready = self.proc.stdout.readline().strip() == "ready"
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.count = 0
        atexit.register(self.close)

    def close(self) -> None:
        """End the server with this process (it ends once its children did), and reap it."""
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _read(self) -> None:
        for line in self.proc.stdout:
            answer = json.loads(line)
            if "status" not in answer:  # a started child's pid (``start``)
                started, box = self.started.pop(answer["id"])
                box.update(answer)
                started.set()
                continue
            event, box = self.waiting.pop(answer["id"])
            box.update(answer)
            global child_cpu
            child_cpu += answer.get("cpu", 0.0)
            event.set()
        for event, box in [*self.waiting.values(), *self.started.values()]:  # the server died
            box["lost"] = True
            event.set()

    def serves(self, module: str, env: dict[str, str]) -> bool:
        if not self.ready or self.proc.poll() is not None or module not in MODULES:
            return False
        keys = (set(env) | set(self.env)) - set(AT_RUN) - {k for k in APPLIED if k in env}
        mine, theirs = {**JAX_SETS, **env}, {**JAX_SETS, **self.env}
        return not any(k.startswith(AT_IMPORT) and mine.get(k) != theirs.get(k) for k in keys)

    def send(self, request: dict) -> tuple[threading.Event, dict] | None:
        """Send ``request`` (its id given here): the event set when its child ended and the box
        its answer fills, or None where the server is gone. A ``started`` request's box gets the
        child's pid first (``started`` set, then ``pid`` in the box)."""
        with self.lock:
            self.count += 1
            request["id"] = rid = f"{os.getpid()}-{self.count}"
            event, box = threading.Event(), {}
            self.waiting[rid] = (event, box)
            if request.get("started"):
                self.started[rid] = (request.pop("started_event"), box)
            try:
                self.proc.stdin.write(json.dumps(request) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                self.waiting.pop(rid, None)
                self.started.pop(rid, None)
                return None
        return event, box

    def run(
        self,
        module: str,
        args: list[str],
        cwd: Path,
        env: dict[str, str],
        timeout: float | None,
        log: Path | None = None,
    ) -> subprocess.CompletedProcess | None:
        """The command's result, or None where the server could not run it (run it cold). With
        ``log``, both its streams are appended to that file, and the result's stdout is what it
        appended."""
        with tempfile.TemporaryDirectory(prefix="dew-warm-") as tmp:
            start = log.stat().st_size if log is not None and log.exists() else 0
            request = {"module": module, "args": list(args), "cwd": str(cwd), "env": env, "timeout": timeout}
            request |= {"stdout": f"{tmp}/out", "stderr": f"{tmp}/err", "log": None if log is None else str(log)}
            sent = self.send(request)
            if sent is None:
                return None
            event, box = sent
            event.wait()
            if box.get("lost"):
                return None
            argv = [sys.executable, "-m", module, *args]
            out, err = (Path(tmp, name).read_text() if Path(tmp, name).exists() else "" for name in ("out", "err"))
            if log is not None:
                with open(log, errors="replace") as f:
                    f.seek(start)
                    out = err = f.read()
            if box["timed_out"]:
                raise subprocess.TimeoutExpired(argv, timeout, out, err)
            return subprocess.CompletedProcess(argv, box["status"], out, err)

    def start(
        self, module: str, args: list[str], cwd: Path, env: dict[str, str], log: Path, session: bool = False
    ) -> Started | None:
        """The command started, both its streams appended to ``log``, as ``subprocess.Popen``
        starts it: its pid known at once, its end awaited later (``session``: in a session and
        process group of its own, as ``start_new_session=True`` starts it: a terminal's foreground
        job, signalled with ``os.killpg``). None where the server is gone."""
        started = threading.Event()
        request = {"module": module, "args": list(args), "cwd": str(cwd), "env": env, "timeout": None}
        request |= {"log": str(log), "started": True, "started_event": started, "session": session}
        sent = self.send(request)
        if sent is None:
            return None
        started.wait()
        if sent[1].get("lost"):
            return None
        return Started([sys.executable, "-m", module, *args], *sent)


class Started:
    """A command the server started (``start``), used as a ``subprocess.Popen``: ``pid``,
    ``poll``, ``wait``, ``returncode``. The server, its parent, reaps it; its end is the server's
    answer."""

    def __init__(self, args: list[str], ended: threading.Event, answer: dict) -> None:
        self.args, self.ended, self.answer = args, ended, answer
        self.pid: int = answer["pid"]

    @property
    def returncode(self) -> int | None:
        return self.answer.get("status") if self.ended.is_set() else None

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        """SIGKILL, as ``Popen.kill``: nothing once it has ended."""
        if not self.ended.is_set():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        if not self.ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        if self.answer.get("lost"):
            raise RuntimeError(f"the warm server ended before {self.args} did")
        return self.answer["status"]


_server: Server | None = None
child_cpu = 0.0
"""CPU seconds of this process's warm commands so far (a cold one's are the process's RUSAGE_CHILDREN)."""
_started = threading.Lock()


def serving(module: str, env: dict[str, str]) -> Server | None:
    """This process's warm server (started at the first command) where it can run ``module`` with
    ``env`` as a cold start would; None where it cannot (or DEW_TESTS_COLD=1)."""
    global _server
    with _started:
        if _server is None and os.environ.get("DEW_TESTS_COLD") != "1":
            from tests.conftest import cli_env

            _server = Server(cli_env())
    return _server if _server is not None and _server.serves(module, env) else None


def run(
    module: str, args: list[str], cwd: Path, env: dict[str, str], timeout: float | None, log: Path | None = None
) -> subprocess.CompletedProcess | None:
    """``python -m module args`` in ``cwd`` with ``env``: warm where it reads what a cold start would.
    With ``log`` (both streams appended there, as ``Server.run`` says): None where it cannot run warm,
    for the caller to run it cold its own way."""
    server = serving(module, env)
    if server is not None:
        result = server.run(module, args, cwd, env, timeout, log)
        if result is not None:
            return result
    if log is not None:
        return None
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def start(
    module: str, args: list[str], cwd: Path, env: dict[str, str], log: Path, session: bool = False
) -> Started | None:
    """``python -m module args`` in ``cwd`` with ``env``, started warm (``Server.start``: used as a
    ``subprocess.Popen``; ``session``: in a process group of its own), both streams appended to
    ``log``; None where it cannot start warm, for the caller to start it cold."""
    server = serving(module, env)
    return None if server is None else server.start(module, args, cwd, env, log, session)


if __name__ == "__main__":
    become(serve())
