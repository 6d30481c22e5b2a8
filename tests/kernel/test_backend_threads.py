"""NetlinkBackend from many threads: one netlink socket, in its namespace.

pyroute2 0.9 opens a socket per thread that uses it (in that thread's
namespace) and keeps it until close(); `pipexctl serve` handles each pppd
in a new thread, so before the backend owned a thread of its own, every
offloaded call left one netlink socket behind."""

from __future__ import annotations

import os
import threading

import pytest

from pipexctl.kernel.backend import NetlinkBackend
from pipexctl.model import Endpoint, TunnelSpec
from pipexctl.testing.lab import fd_kinds

from .conftest import ip_l2tp

pytestmark = pytest.mark.kernel


def test_threads_share_one_socket_in_the_backends_namespace(pair):
    b = NetlinkBackend(netns=pair.a)
    try:
        before = fd_kinds(os.getpid()).get("socket:netlink", 0)
        errors = []

        def work(i):
            try:
                b.tunnel_create(TunnelSpec(tunnel_id=300 + i, peer_tunnel_id=400 + i, version=3,
                                           local=Endpoint.parse(f"{pair.A4}:{5000 + i}"),
                                           remote=Endpoint.parse(f"{pair.B4}:{5000 + i}")))
            except Exception as e:  # reported below, with the thread's index
                errors.append((i, e))

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert fd_kinds(os.getpid()).get("socket:netlink", 0) == before
        # all eight landed in the backend's namespace, as iproute2 sees it
        assert sorted(t["tunnel_id"] for t in ip_l2tp(pair.a, "tunnel")) == list(range(300, 308))
    finally:
        for i in range(8):
            try:
                b.tunnel_delete(300 + i)
            except Exception:
                pass
        b.close()
