"""`ruff check` over the tree, with the rule set in pyproject.toml
([tool.ruff]): pyflakes, the import order, bugbear and pycodestyle's
errors.  Ruff is a test dependency; its absence fails this test."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
