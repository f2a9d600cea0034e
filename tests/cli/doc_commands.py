"""Every shell command the documentation shows, as a user would type it: collected from the fenced
blocks of README.md, docs/*.md and launch/README.md, and from the examples of ``dew-train --help``
(conf/hydra/help/dew.yaml), with nothing registered by hand.

A block is a shell block when its fence names no language or ``bash``/``sh``/``shell``/``console``.
In it, a backslash-continued line (or a quoted string spanning lines) is one line; ``$ `` prompts are
dropped, and where a block has prompts, the lines without one are the output of the command above
(``Command.output``). A line is a command when its first word (after ``NAME=value`` assignments) is a
program: a dew console script, ``python``/``pip``/``pytest`` (a path before it, like
``.venv/bin/``, is kept); or a shell variable set from a command (``sweep=$(ls -d ...)``), which
later commands of the page need. Lines of trees, pseudo-code and printed output are not commands.

A page says why it does not run a command in a marker the test reads: ``<!-- dew-docs: skip
REASON -->`` on the line before the fence (every command of the block), or a trailing ``# not run:
REASON`` on the command.
"""

from __future__ import annotations

import dataclasses
import re
import shlex

import yaml

from tests.conftest import REPO

SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
BLOCK_SKIP = re.compile(r"<!--\s*dew-docs:\s*skip\s+(.*?)\s*-->\s*$")
LINE_SKIP = re.compile(r"\s#.*?\bnot run:\s*(.*?)\)?$")
ASSIGNMENTS = r"(?:[A-Za-z_]\w*=\S*\s+)*"
PROGRAM = re.compile(rf"^{ASSIGNMENTS}(?:\S*/)?(dew-[a-z]+|python3?|pip|pytest)(?:\s|$)")
VARIABLE = re.compile(r"^[A-Za-z_]\w*=\$\(")
DEW_SCRIPTS = (
    "dew-train",
    "dew-runs",
    "dew-sample",
    "dew-prepare",
    "dew-export",
    "dew-plan",
    "dew-recipe",
    "dew-eval",
)


@dataclasses.dataclass
class Command:
    """One command of a page, as written."""

    page: str
    """README.md, docs/data.md, launch/README.md, or ``dew-train --help``."""
    line: int
    """Its (first) line in the page."""
    text: str
    """The command, continued lines joined, its comment and marker dropped."""
    skip: str | None = None
    """Why the page does not run it (its marker), None if it runs."""
    output: list[str] = dataclasses.field(default_factory=list)
    """What the page shows it printing (a ``$``-prompt block's lines after it)."""

    @property
    def program(self) -> str:
        """``dew-train``, ``dew-runs``, ..., ``python``, or ``variable`` for ``name=$(...)``."""
        if VARIABLE.match(self.text):
            return "variable"
        name = PROGRAM.match(self.text).group(1)
        if name.startswith("python") and re.search(r"\spython3?\s+-m\s+dew[\w.]*(\s|$)", f" {self.text}"):
            return "python -m dew"
        return name

    @property
    def is_dew(self) -> bool:
        return self.program in (*DEW_SCRIPTS, "python -m dew")

    def argv(self) -> list[str]:
        """The words of a command that uses no shell variable, its assignments left out."""
        words = shlex.split(self.text)
        while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
            words.pop(0)
        return words

    def env(self) -> dict[str, str]:
        """The ``NAME=value`` assignments before the program."""
        words, env = shlex.split(self.text), {}
        while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        return env

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def pages() -> dict[str, str]:
    """Each page's name and text: README.md, docs/*.md, launch/README.md."""
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "launch" / "README.md"]
    return {str(f.relative_to(REPO)): f.read_text() for f in files}


def help_commands() -> list[Command]:
    """The examples in ``dew-train --help``'s footer (conf/hydra/help/dew.yaml)."""
    footer = yaml.safe_load((REPO / "conf" / "hydra" / "help" / "dew.yaml").read_text())["footer"]
    found = []
    for number, line in enumerate(footer.splitlines(), 1):
        text = line.strip()
        if PROGRAM.match(text):
            found.append(Command("dew-train --help", number, _drop_comment(text)))
    return found


def collect(page: str, text: str) -> list[Command]:
    """Every command of one page's shell blocks, in the page's order."""
    found: list[Command] = []
    for fence in FENCE.finditer(text):
        if fence.group(1) not in SHELL_FENCES:
            continue
        start = text.count("\n", 0, fence.start()) + 1  # the fence's line
        before = text[: fence.start()].rstrip("\n").rsplit("\n", 1)[-1]
        block_skip = BLOCK_SKIP.search(before)
        found += _block_commands(page, start + 1, fence.group(2), block_skip.group(1) if block_skip else None)
    return found


def _block_commands(page: str, first: int, block: str, skip: str | None) -> list[Command]:
    prompted = any(line.startswith("$ ") for line in block.splitlines())
    found: list[Command] = []
    for number, line in _logical_lines(block, first):
        if prompted and not line.startswith("$ "):
            if found:
                found[-1].output.append(line)
            continue
        line = line.removeprefix("$ ").strip()
        marker = LINE_SKIP.search(line)
        for part in _parts(_drop_comment(line)):
            if PROGRAM.match(part) or VARIABLE.match(part):
                found.append(Command(page, number, part, marker.group(1).strip() if marker else skip))
    return found


def _parts(line: str) -> list[str]:
    """The commands of a shell line: split at ``&&``, ``||``, ``;``, ``&`` and ``|`` outside quotes
    and ``$(...)``."""
    parts, start, quote, depth, i = [], 0, "", 0, 0
    while i < len(line):
        char = line[i]
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif line.startswith("$(", i):
            depth, i = depth + 1, i + 1
        elif char == ")" and depth:
            depth -= 1
        elif char in "&|;" and not depth:
            parts.append(line[start:i])
            i += 1 if line[i : i + 2] not in ("&&", "||") else 2
            start = i
            continue
        i += 1
    return [p.strip() for p in [*parts, line[start:]] if p.strip()]


def _logical_lines(block: str, first: int) -> list[tuple[int, str]]:
    """(line number, text): backslash-continued lines and quoted strings across lines joined."""
    lines, out, pending, start = block.split("\n"), [], "", 0
    for offset, line in enumerate(lines):
        if not pending:
            start = offset
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip() + " "
            continue
        if _unbalanced(pending):
            continue
        out.append((first + start, re.sub(r"\s*\n\s*", " ", pending) if not _quoted_newline(pending) else pending))
        pending = ""
    return [(n, t) for n, t in out if t.strip()]


def _unbalanced(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
    except ValueError:
        return True
    return False


def _quoted_newline(text: str) -> bool:
    """A line break inside quotes (``python -c "..."``) is the program's own: kept."""
    return "\n" in text and any("\n" in word for word in shlex.split(text, comments=True))


def _drop_comment(line: str) -> str:
    """The command without its trailing ``# comment`` (a ``#`` inside quotes is the command's)."""
    cut = len(line)
    for match in re.finditer(r"\s#", line):
        try:
            shlex.split(line[: match.start()])
        except ValueError:
            continue  # inside quotes
        cut = match.start()
        break
    return line[:cut].strip()


def documented() -> list[Command]:
    """Every command of every page and of ``dew-train --help``."""
    return [c for page, text in pages().items() for c in collect(page, text)] + help_commands()
