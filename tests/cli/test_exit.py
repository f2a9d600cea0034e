"""A dew command run as a program ends once ``main`` ended, its threads ended and its exit handlers
ran, with ``main``'s status, and skips the interpreter's tear-down; called from Python code, its
``main`` returns or raises as any function does."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from dew.commandline.console import console_script
from dew.launching.gc_settings import THRESHOLDS

PROGRAM = textwrap.dedent(
    """
    import atexit, sys, threading, time
    from concurrent.futures import ThreadPoolExecutor
    from dew.commandline.console import console_script

    class TornDown:
        def __del__(self):  # runs in the interpreter's tear-down, which the command skips
            sys.stderr.write("torn down\\n")

    torn_down = TornDown()

    def late_writer():
        time.sleep(0.3)
        print("the thread's last line", flush=True)

    @console_script
    def main():
        atexit.register(lambda: print("exit handler ran"))
        threading.Thread(target=late_writer).start()  # not a daemon: the command waits for it
        global executor
        executor = ThreadPoolExecutor(1)  # kept: its idle worker, never shut down, is told to leave at the end
        executor.submit(int).result()
        print("unflushed output", end="")  # flushed at the end
        how = sys.argv[1]
        if how == "return":
            return None
        if how == "exit":
            sys.exit(int(sys.argv[2]))
        if how == "message":
            sys.exit("dew-x: a message")
        if how == "gc":
            import gc
            print(" gc", gc.get_threshold())
            return None
        raise RuntimeError("a bug")

    if __name__ == "__main__":
        main()
    """
)


@pytest.fixture
def run(tmp_path):
    (tmp_path / "command.py").write_text(PROGRAM)

    def run(*args: str, how: str = "-m") -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "command"] if how == "-m" else [sys.executable, "-c", how]
        return subprocess.run([*argv, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)

    return run


@pytest.mark.parametrize(
    ("args", "status", "err"),
    [(["return"], 0, ""), (["exit", "3"], 3, ""), (["exit", "0"], 0, ""), (["message"], 1, "dew-x: a message\n")],
)
def test_a_command_ends_with_its_status_after_its_threads_and_exit_handlers(run, args, status, err):
    done = run(*args)
    assert done.returncode == status, done
    assert done.stdout == "unflushed outputthe thread's last line\nexit handler ran\n"
    assert done.stderr == err  # no "torn down": the interpreter's tear-down did not run


def test_an_error_ends_as_python_ends_it(run):
    done = run("raise")
    assert done.returncode == 1 and "RuntimeError: a bug" in done.stderr and "Traceback" in done.stderr
    assert done.stderr.endswith("torn down\n")  # Python's own end, tear-down included


def test_a_script_that_calls_main_gets_its_status_back(run):
    script = "\n".join(
        [
            "import sys, command",
            "sys.argv[1:] = ['exit', '5']",
            "try:",
            "    command.main()",
            "except SystemExit as e:",
            "    print(' status', e.code)",
        ]
    )
    done = run(how=script)  # main at the top of the caller's own program, called as a function
    assert done.returncode == 0 and done.stdout.startswith("unflushed output") and " status 5\n" in done.stdout
    assert done.stderr.endswith("torn down\n")  # the caller's program ends as Python ends it


def test_called_from_python_code_main_returns_and_raises():
    @console_script
    def main(code):
        if code is None:
            return "returned"
        sys.exit(code)

    assert main(None) == "returned"
    with pytest.raises(SystemExit) as stop:
        main(4)
    assert stop.value.code == 4


def test_run_as_a_program_the_command_collects_garbage_less_often(run):
    done = run("gc")
    assert done.returncode == 0 and f" gc {THRESHOLDS}" in done.stdout, done  # CPython's default: (700, 10, 10)


def test_called_from_python_code_main_leaves_the_callers_garbage_collector_alone():
    import gc

    before = gc.get_threshold()
    gc.set_threshold(1234, 5, 6)
    try:

        @console_script
        def main():
            return gc.get_threshold()

        assert main() == (1234, 5, 6)
    finally:
        gc.set_threshold(*before)
