"""`ruff check` over the tree, with the rule set in pyproject.toml
([tool.ruff]): pyflakes, the import order, bugbear and pycodestyle's
errors; and mypy over the modules [tool.mypy] lists.  Both are test
dependencies; the absence of either fails its test."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_finds_nothing_in_the_typed_modules():
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", "/dev/null"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
