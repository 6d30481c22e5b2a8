"""The `pipexctl` command's entry point (the console script, ``python -m
pipexctl`` and the Debian package's /usr/bin/pipexctl all call it).

It runs before the CLI imports anything and leaves out two things the
command never uses, which a daemon would otherwise carry in its RSS:
OpenSSL (3.5 MiB) and pydantic's plugin loader (1.4 MiB).  A program
that imports the library keeps both as they are."""

from __future__ import annotations

import sys
import types


def without_openssl() -> None:
    """Keep OpenSSL out of this process: hashlib, hmac and secrets then use
    the interpreter's own code.  Nothing here needs more than hashlib's
    built-in hashes (a checkpoint's SHA-256), but pydantic imports hashlib
    through ``secrets`` and ``hmac``, which would map libcrypto.  Too late
    once something has imported hashlib."""
    sys.modules.setdefault("_hashlib", None)  # type: ignore[arg-type]


def without_pydantic_plugins() -> None:
    """Tell pydantic there are no plugins, without its loader: the loader
    imports importlib.metadata (and with it email, zipfile, csv...) and reads
    every installed package's entry points when the first model is built.
    The command uses no pydantic plugin.  tests/unit/test_entry.py checks
    that the installed pydantic still asks this module's get_plugins and
    builds and validates models with the stand-in."""
    loader = types.ModuleType("pydantic.plugin._loader", "pipexctl: no pydantic plugins in this process")
    loader.get_plugins = lambda: ()  # type: ignore[attr-defined]
    sys.modules.setdefault("pydantic.plugin._loader", loader)


def lean() -> None:
    """What the command leaves out, done before anything is imported (the
    benches that measure serve's memory call it too)."""
    without_openssl()
    without_pydantic_plugins()


def main() -> None:
    lean()
    from .cli import main as cli_main

    cli_main()
