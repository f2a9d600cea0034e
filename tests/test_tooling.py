"""The team's tools run in the suite: the tree is formatted (``ruff format``), passes the lint rules
``pyproject.toml`` selects (``ruff check``) and type-checks (``mypy`` over dew/). The versions are the
test extra's, so the suite, pre-commit (``.pre-commit-config.yaml``) and an editor agree."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

TREES = ["dew", "tests", "bench", "hydra_plugins"]


def tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=900)


def test_the_tree_is_formatted():
    result = tool("ruff", "format", "--check", *TREES)
    assert result.returncode == 0, f"run `ruff format {' '.join(TREES)}`:\n{result.stdout}{result.stderr}"


def test_the_tree_passes_the_lint_rules():
    result = tool("ruff", "check", *TREES)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_dew_type_checks():
    result = tool("mypy")  # files and settings: pyproject.toml's [tool.mypy]
    assert result.returncode == 0 and "Success" in result.stdout, result.stdout[-5000:] + result.stderr
