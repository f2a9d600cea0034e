"""What every dew command does with the terminal it writes to (each console script's ``main`` is
wrapped in ``console_script``):

- a reader that leaves early (``dew-train --help | head``, ``dew-runs ... | head``) ends the command
  quietly: no ``BrokenPipeError`` traceback, exit status ``EXIT_CLOSED_PIPE`` (141, what a shell
  reports for a command that SIGPIPE ended), the rest of its output thrown away. The write that
  meets the closed pipe exits at once (``SystemExit``), so that a library in between which reports
  any ``Exception`` as a traceback (Hydra prints ``--help`` inside one) lets it through;
- when stderr is not a terminal (a pipe, a log file, a test's capture), colour is off for the
  libraries that follow the ``NO_COLOR`` convention (https://no-color.org): Optuna's log lines
  (through colorlog) carry no ANSI escape codes. ``FORCE_COLOR`` or a ``NO_COLOR`` already set wins;
- the command, run as a program (its console script, ``python -m``), ends once ``main`` returned or
  exited and its threads and exit handlers are done, without Python's tear-down of the modules it
  imported (``dew.launching.interrupts.end_process``: -0.3 CPU-s a command, bench/exit_time.py). Called from Python
  code, ``main`` returns (or raises ``SystemExit``) as any function does;
- run as a program, the command collects garbage less often (``dew.launching.gc_settings``: -6% CPU
  on a tiny training run, bench/gc_settings.py); called from Python code, it leaves the caller's
  garbage collector as it is.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TextIO

from dew.launching.gc_settings import collect_less
from dew.launching.interrupts import end_process

EXIT_CLOSED_PIPE = 141
"""The reader of stdout went away (128 + SIGPIPE, as a shell reports ``cat big | head``)."""


def _is_terminal(stream: TextIO | None) -> bool:
    if stream is None:  # no stream
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # not a file, or a closed one
        return False


def _closed_pipe(stream: TextIO) -> NoReturn:
    """End the command: ``stream`` goes to /dev/null (Python flushes it again at exit), exit 141."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)
    raise SystemExit(EXIT_CLOSED_PIPE)


class _Stdout:
    """``sys.stdout`` whose writes end the command quietly when the reader has gone."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            _closed_pipe(self._stream)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            _closed_pipe(self._stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _the_program(main: Callable[..., Any], caller: dict[str, Any]) -> bool:
    """Whether ``main`` was called as the program, not from Python code: by its own module run as
    ``python -m`` (its ``__main__``), or by a dew console script (``dew-train``, ...)."""
    if caller.get("__name__") != "__main__":
        return False
    return caller is inspect.unwrap(main).__globals__ or os.path.basename(sys.argv[0]).startswith("dew-")


def console_script[F: Callable[..., Any]](main: F) -> F:
    """``main`` as a console script: quiet on a closed pipe, no colour when stderr is not a terminal."""

    @functools.wraps(main)
    def run(*args: Any, **kwargs: Any) -> Any:
        program = _the_program(main, sys._getframe(1).f_globals)
        if program:  # the process is the command's own: its garbage collector too (dew.launching.gc_settings)
            collect_less()
        if not _is_terminal(sys.stderr) and "FORCE_COLOR" not in os.environ:
            os.environ.setdefault("NO_COLOR", "1")
        stdout, sys.stdout = sys.stdout, _Stdout(sys.stdout)
        try:
            status = main(*args, **kwargs)
        except SystemExit as stop:
            if not program:
                raise
            status = stop.code
        finally:
            try:
                sys.stdout.flush()  # a reader gone after the last write shows here, not at exit
            finally:
                sys.stdout = stdout
        if not program:
            return status
        end_process(status)

    return run  # type: ignore[return-value]
