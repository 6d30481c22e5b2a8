"""The `pipexctl` command's entry point (the console script, ``python -m
pipexctl`` and the Debian package's /usr/bin/pipexctl all call it).

It runs before the CLI imports anything, so that the command never loads
OpenSSL: nothing in it needs more than hashlib's built-in hashes (a
checkpoint's SHA-256), but pydantic imports hashlib through ``secrets``
and ``hmac``, which would map libcrypto, 3.5 MiB of a daemon's RSS.  A
program that imports the library keeps its own hashlib as it is."""

from __future__ import annotations

import sys


def without_openssl() -> None:
    """Keep OpenSSL out of this process: hashlib, hmac and secrets then use
    the interpreter's own code.  Too late once something has imported hashlib."""
    sys.modules.setdefault("_hashlib", None)  # type: ignore[arg-type]


def main() -> None:
    without_openssl()
    from .cli import main as cli_main

    cli_main()
