"""NetlinkBackend from many threads: one netlink socket, in its namespace;
and a dump that takes many answers.

pyroute2 0.9's socket opened one more socket per thread that used it (in
that thread's namespace) and kept it until close(); `pipexctl serve`
handles each pppd in a new thread.  The backend now sends on a plain
netlink socket opened once in its namespace."""

from __future__ import annotations

import dataclasses
import os
import threading

import pytest

from pipexctl.kernel.backend import NetlinkBackend
from pipexctl.model import Endpoint, PwType, SessionCounters, SessionSpec, TunnelSpec, session_key
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


def test_a_dump_of_many_answers_is_whole_and_the_socket_stays_usable(pair):
    """600 sessions: the kernel splits the dump over several 32 KiB answers;
    each raw reader (ids, counters) reads them all as the decoder does."""
    b = NetlinkBackend(netns=pair.a)
    try:
        b.tunnel_create(TunnelSpec(tunnel_id=310, peer_tunnel_id=410, version=2,
                                   local=Endpoint.parse(f"{pair.A4}:5310"), remote=Endpoint.parse(f"{pair.B4}:5310")))
        for sid in range(1, 601):
            b.session_create(SessionSpec(tunnel_id=310, session_id=sid, peer_session_id=sid, version=2,
                                         pw_type=PwType.ppp))
        want = {(310, sid) for sid in range(1, 601)}
        assert b.session_ids() == want
        assert b.session_keys() == {session_key(*ids) for ids in want}
        dumped = b.session_dump()
        assert {(s.tunnel_id, s.session_id) for s in dumped} == want
        # the raw counters reader (metrics) gives the decoder's ids and counters
        assert sorted(b.session_counters()) == sorted(
            SessionCounters(s.tunnel_id, s.session_id, *dataclasses.astuple(s.stats)) for s in dumped)
        handed: list[SessionCounters] = []  # a scrape's way: each session handed over as read, none kept
        assert b.session_counters(handed.append) == []
        assert sorted(handed) == sorted(b.session_counters())
        assert len([x for x in ip_l2tp(pair.a, "session") if x["tunnel_id"] == 310]) == 600
        assert b.session_get(310, 600).peer_session_id == 600  # a request right after a dump
    finally:
        try:
            b.tunnel_delete(310)
        finally:
            b.close()
