"""Write docs/cli.md from the CLI's own --help (tests/unit/test_docs.py checks it is current).

    .venv/bin/python scripts/gen_cli_docs.py > docs/cli.md
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from click.testing import CliRunner  # noqa: E402

from pipexctl.cli import cli  # noqa: E402


def render() -> str:
    out = ["# `pipexctl` command reference", "",
           "Generated from `--help` by `scripts/gen_cli_docs.py`; a unit test fails when it is out of date.", ""]
    runner = CliRunner()
    pages = [("pipexctl", [])] + [(f"pipexctl {name}", [name]) for name in sorted(cli.commands)]
    for title, args in pages:
        text = runner.invoke(cli, args + ["--help"], prog_name="pipexctl", terminal_width=100).output
        out += [f"## {title}", "", "```", text.rstrip(), "```", ""]
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(render())
