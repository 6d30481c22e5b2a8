"""The `pipexctl` command's entry point (the console script, ``python -m
pipexctl`` and the Debian package's /usr/bin/pipexctl all call it).

It runs before the CLI imports anything and leaves out OpenSSL (3.5 MiB),
which the command never uses and a daemon would otherwise carry in its
RSS.  A program that imports the library keeps it as it is."""

from __future__ import annotations

import sys


def without_openssl() -> None:
    """Keep OpenSSL out of this process: hashlib, hmac and secrets then use
    the interpreter's own code.  Nothing here needs more than hashlib's
    built-in hashes (a checkpoint's SHA-256), but ``import hashlib`` would
    map libcrypto.  Too late once something has imported hashlib."""
    sys.modules.setdefault("_hashlib", None)  # type: ignore[arg-type]


def lean() -> None:
    """What the command leaves out, done before anything is imported (the
    benches that measure serve's memory call it too)."""
    without_openssl()


def main() -> None:
    lean()
    from .cli import main as cli_main

    cli_main()
