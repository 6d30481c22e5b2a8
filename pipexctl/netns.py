"""Network namespaces (``ip netns`` compatible): `pipexctl -n NAME`, tests, the demo lab.

``enter(name)`` moves the *calling thread* into ``/run/netns/<name>`` and back;
sockets opened inside keep that namespace.  Python 3.11 has no os.setns, so
setns(2) is called through ctypes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
from typing import Any, Iterator

from . import defaults
from .errors import NotFoundError

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(defaults.LIBC, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


@contextlib.contextmanager
def enter(name: str) -> Iterator[None]:
    """Run the body in network namespace ``name`` (calling thread only)."""
    here = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(name if name.startswith("/") else f"/run/netns/{name}", os.O_RDONLY)
    except OSError as e:
        os.close(here)
        raise NotFoundError(f"network namespace {name} does not exist ({e.strerror})") from None
    try:
        _setns(target)
        yield
    finally:
        _setns(here)
        os.close(here)
        os.close(target)


def maybe_enter(name: str | None) -> contextlib.AbstractContextManager[None]:
    """``enter(name)``, or nothing to do for None (this namespace)."""
    return enter(name) if name else contextlib.nullcontext()


def run(cmd: list[str], ns: str | None = None, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    argv = (["ip", "netns", "exec", ns] if ns else []) + cmd
    return subprocess.run(argv, check=check, capture_output=True, text=True, **kw)


class Pair:
    """Two namespaces joined by a veth: ``a`` (10.98.0.1, fd00:98::1) and ``b`` (.2, ::2)."""

    A4, B4 = "10.98.0.1", "10.98.0.2"
    A6, B6 = "fd00:98::1", "fd00:98::2"

    def __init__(self, prefix: str = "pxt", mtu: int = 1500) -> None:
        tag = os.urandom(3).hex()
        self.a, self.b = f"{prefix}{tag}a", f"{prefix}{tag}b"
        self.mtu = mtu

    def up(self) -> "Pair":
        def sh(*c: str) -> None:
            subprocess.run(list(c), check=True, capture_output=True, text=True)

        sh("ip", "netns", "add", self.a)
        sh("ip", "netns", "add", self.b)
        sh("ip", "link", "add", "va", "netns", self.a, "mtu", str(self.mtu), "type", "veth",
           "peer", "name", "vb", "netns", self.b, "mtu", str(self.mtu))
        for ns, dev, v4, v6 in ((self.a, "va", self.A4, self.A6), (self.b, "vb", self.B4, self.B6)):
            sh("ip", "-n", ns, "addr", "add", f"{v4}/24", "dev", dev)
            sh("ip", "-n", ns, "addr", "add", f"{v6}/64", "dev", dev, "nodad")
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        return self

    def down(self) -> None:
        for ns in (self.a, self.b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def __enter__(self) -> "Pair":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()
