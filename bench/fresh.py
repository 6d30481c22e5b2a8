"""Ways of one measurement, each in an interpreter of its own, interleaved:
the ways in turn, reversed every other round, so that the machine's drift
falls on all of them alike (bench/servemem.py, bench/scanproc.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent


def interleaved(ways: Sequence[str], rounds: int, child_args: Callable[[str], list[str]]) -> list[dict]:
    """Run ``python *child_args(way)`` for each way, ``rounds`` times; each
    prints one JSON object, returned (and printed) with its round."""
    rows = []
    for r in range(rounds):
        for way in ways if r % 2 == 0 else tuple(reversed(ways)):
            res = subprocess.run([sys.executable, *child_args(way)], check=True, capture_output=True, text=True,
                                 cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
            row = json.loads(res.stdout)
            row["round"] = r + 1
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def write_rows(path: str, what: dict, rows: list[dict]) -> None:
    """The rows as one JSON record, with what was measured and the interpreter's version."""
    Path(path).write_text(json.dumps({**what, "python": sys.version.split()[0], "rows": rows}, indent=1) + "\n")
