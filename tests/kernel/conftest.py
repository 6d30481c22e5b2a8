"""Fixtures for tests against the real kernel (inside the guest).

Every test gets its own pair of network namespaces joined by a veth and
removes them afterwards.  Kernel state is checked with iproute2 (`ip l2tp
show`, `ip -s link`), never only with pipexctl itself.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pipexctl import netns
from pipexctl.kernel.backend import NetlinkBackend
from pipexctl.kernel.check import sessions_per_namespace
from pipexctl.orchestrator import Orchestrator
from pipexctl.testing.probe import ip_json, wait_until  # noqa: F401  (tests import wait_until from here)

# A second tunnel from one peer address and port: steered by nft before Linux
# 6.11, on xl2tpd's port like the first from 6.11 on (the tests expect each)
TWINS_STEERED = not sessions_per_namespace()


@pytest.fixture(params=["userspace", "kernel"])
def lab(request):
    """An xl2tpd LNS and two LACs, in xl2tpd's userspace and kernel mode."""
    from pipexctl.testing.lab import Lab

    lab = Lab(kernel_mode=request.param == "kernel").setup(2)
    try:
        lab.start_all()
        yield lab
    finally:
        lab.teardown(keep_as="")


@pytest.fixture
def pair():
    p = netns.Pair().up()
    try:
        yield p
    finally:
        p.down()


class NsOrch:
    """An Orchestrator whose netlink socket lives in namespace ``ns``."""

    def __init__(self, ns: str) -> None:
        self.ns = ns
        self.backend = NetlinkBackend(netns=ns)
        self.orch = Orchestrator(self.backend)

    def close(self) -> None:
        self.backend.close()


@pytest.fixture
def orch_in():
    made: list[NsOrch] = []

    def make(ns: str) -> Orchestrator:
        o = NsOrch(ns)
        made.append(o)
        return o.orch

    yield make
    for o in made:
        o.close()


def ip_l2tp(ns: str, what: str) -> list[dict]:
    """Parse `ip l2tp show tunnel|session` (iproute2 has no JSON for it)."""
    out = subprocess.run(["ip", "-n", ns, "l2tp", "show", what], capture_output=True, text=True, check=True).stdout
    items: list[dict] = []
    for line in out.splitlines():
        m = re.match(r"Tunnel (\d+), encap (\w+)", line)
        if m:
            items.append({"tunnel_id": int(m[1]), "encap": m[2]})
            continue
        m = re.match(r"Session (\d+) in tunnel (\d+)", line)
        if m:
            items.append({"session_id": int(m[1]), "tunnel_id": int(m[2])})
            continue
        cur = items[-1] if items else {}
        if m := re.match(r"\s+From (\S+) to (\S+)", line):
            cur["local"], cur["remote"] = m[1], m[2]
        elif m := re.match(r"\s+Peer tunnel (\d+)", line):
            cur["peer_tunnel_id"] = int(m[1])
        elif m := re.match(r"\s+UDP source / dest ports: (\d+)/(\d+)", line):
            cur["sport"], cur["dport"] = int(m[1]), int(m[2])
        elif m := re.match(r"\s+Peer session (\d+), tunnel (\d+)", line):
            cur["peer_session_id"], cur["peer_tunnel_id"] = int(m[1]), int(m[2])
        elif m := re.match(r"\s+interface name: (\S+)", line):
            cur["ifname"] = m[1]
    return items


def link_stats(ns: str, dev: str) -> dict:
    st = ip_json(ns, "-s", "link", "show", dev)[0]["stats64"]
    return {"rx_packets": st["rx"]["packets"], "tx_packets": st["tx"]["packets"],
            "rx_bytes": st["rx"]["bytes"], "tx_bytes": st["tx"]["bytes"]}




class Watcher:
    """Runs Discovery.events() in a thread and collects what it yields."""

    def __init__(self, discovery, limit: float = 240) -> None:
        import threading
        import time

        self.discovery, self.got, self._stop = discovery, [], threading.Event()
        self._t = threading.Thread(target=self._run, args=(time.monotonic() + limit,), daemon=True)
        self._t.start()

    def _run(self, until: float) -> None:
        for e in self.discovery.events(poll=0.1, reconcile_every=0.5, until=until, stop=self._stop):
            self.got.append(e)

    def wait_for(self, pred, what: str, timeout: float = 60) -> None:
        wait_until(pred, what, timeout, lambda: f"; events: {[e.event for e in self.got]}")

    def stop(self) -> None:
        self._stop.set()
        self._t.join(10)
        self.discovery.close()


@pytest.fixture
def packaged(tmp_path):
    """The .deb `make deb` built, and where pppd loads the plugin from; the
    set-up's own copy of the plugin there (no package owns it) is put back
    after the test, whatever it installed or purged."""
    debs = sorted((Path(__file__).resolve().parents[2] / "dist").glob("pipexctl_*_amd64.deb"))
    assert debs, "dist/pipexctl_*_amd64.deb is missing: `make deb` (make test builds it before the guest boots)"
    r = subprocess.run(["pppd", "--version"], capture_output=True, text=True)
    plugin = Path(f"/usr/lib/pppd/{(r.stdout + r.stderr).split()[2]}/pipexctl.so")
    saved = tmp_path / "pipexctl.so.setup"
    had = plugin.exists()
    if had:
        shutil.copy2(plugin, saved)
    yield debs[-1], plugin
    if had:
        shutil.copy2(saved, plugin)
