"""Docs stay true to the CLI (sqlite-utils style)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    """scripts/<name>.py loaded as a module (the generators are not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _gen():
    return _script("gen_cli_docs")


def test_cli_reference_is_current():
    assert (ROOT / "docs" / "cli.md").read_text() == _gen().render(), (
        "docs/cli.md is stale: run .venv/bin/python scripts/gen_cli_docs.py > docs/cli.md"
    )


def test_every_command_is_documented():
    from pipexctl.cli import cli

    text = (ROOT / "docs" / "cli.md").read_text()
    for name in cli.commands:
        assert f"## pipexctl {name}\n" in text


def test_readme_commands_are_make_targets():
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert "make demo" in readme and "make test" in readme
    assert "\ndemo:" in makefile and "\ntest:" in makefile
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    import re

    named = set(re.findall(r"`make ([a-z][a-z-]*)", readme))
    assert {"demo", "test", "bench", "bench-profile", "churn"} <= named
    for target in named:
        assert f"\n{target}:" in makefile, f"README names `make {target}`, which the Makefile lacks"


def _gen_man():
    return _script("gen_man")


def test_man_page_is_current_and_documents_every_command():
    from pipexctl.cli import cli

    text = (ROOT / "docs" / "pipexctl.8").read_text()
    assert text == _gen_man().render(), "docs/pipexctl.8 is stale: run .venv/bin/python scripts/gen_man.py > docs/pipexctl.8"
    for name in cli.commands:
        assert f".SS pipexctl {name}\n" in text


def test_man_page_documents_every_plugin_option():
    import re

    table = (ROOT / "plugins" / "pipexctl.c").read_text()
    names = re.findall(r'^\s*\{ "(pipexctl_\w+)",', table, re.M)
    assert len(names) >= 5, names  # the option table was found
    text = (ROOT / "docs" / "pipexctl.8").read_text()
    assert [n for n in names if f"\\fB{n}\\fR" not in text] == []


def test_man_page_renders_without_groff_warnings():
    import subprocess

    r = subprocess.run(["groff", "-man", "-ww", "-z", str(ROOT / "docs" / "pipexctl.8")], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr
