"""Faults inside the offload, and ids that xl2tpd reuses, with real xl2tpd,
pppd, plugin and `pipexctl serve` in the guest.  What the kernel holds is
counted with iproute2, /proc/net/pppol2tp and nft (pipexctl.testing.lab.
kernel_objects), never asked of pipexctl."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from pipexctl.offload.service import FAILPOINTS
from pipexctl.testing.lab import Lab, kernel_objects, plugin_options
from pipexctl.testing.probe import ppp_inet_links, ppp_peer_addrs, wait_until

from .conftest import TWINS_STEERED, ip_l2tp

pytestmark = pytest.mark.kernel

# the LAC keeps asking for LCP while the LNS daemon restarts (~15 s under TCG).
# After the plugin line on purpose: a protocol option there crashed pppd
# (the plugin's channel had no option table), and "asyncmap" is one of the
# tty channel's own options, which the pty fallback needs recognised.
PATIENT = "lcp-max-configure 60\nasyncmap 0\n"


def objects(ns: str) -> dict:
    o = kernel_objects(ns)
    del o["ppp_links"]  # a call on its pty has a PPP link too
    return o


def offloaded(n: int) -> dict:
    """What n offloaded calls, one per tunnel, all tunnels from one peer
    address and port, leave in the kernel: one tunnel on xl2tpd's port, the
    others too from Linux 6.11, before that steered by the three rules of
    the twins' maps."""
    return {"tunnels": n, "sessions": n, "pppol2tp_sessions": n, "nft_rules": 3 if n > 1 and TWINS_STEERED else 0}


def ping_all(src_ns: str, ns_with_peers: str) -> None:
    for addr in ppp_peer_addrs(ns_with_peers).values():
        r = subprocess.run(["ip", "netns", "exec", src_ns, "ping", "-c", "3", "-i", "0.2", "-W", "3", addr],
                           capture_output=True, text=True)
        assert r.returncode == 0, f"ping {addr}: {r.stdout}"


@pytest.mark.one_debian("the daemon's rollback order at each failpoint; the kernel's side of a kill is test_offload's on both")
def test_kill9_at_each_point_of_the_offload_sequence():
    """The LNS daemon, started with PIPEXCTL_FAILPOINT=<point>, SIGKILLs
    itself there while offloading a new call (each call its own tunnel);
    its restart reconciles and is armed with the next point.  After every
    restart the kernel holds exactly the objects of the calls that were
    offloaded and live: none for a kill before the channel reached pppd
    (that pppd goes on on its pty), the call's for a kill after."""
    lab = Lab(kernel_mode=False, sections=len(FAILPOINTS)).setup(1)
    try:
        # the start's sequence only: a call left on its pty is not moved in later (test_live_offload)
        lab.start_all(plugin_options(required=False) + PATIENT + "pipexctl_move 0\n")
        l1 = lab.lacs[0]
        lab.serve(l1)
        srv = lab.serve(lab.lns, env={"PIPEXCTL_FAILPOINT": FAILPOINTS[0]})
        log = lab.lns.dir / "serve.log"
        done = 0
        for i, (point, section) in enumerate(zip(FAILPOINTS, lab.section_names())):
            at = log.stat().st_size
            lab.connect(l1, section=section, timeout=60)
            wait_until(lambda: srv.poll() is not None, f"the daemon's SIGKILL at {point}", timeout=90,
                       detail=lab.tails)
            assert srv.returncode == -signal.SIGKILL and f"failpoint {point}: SIGKILL" in log.read_text()[at:]
            done += point == "channel-sent"  # pppd had the channel: a live offloaded call
            nxt = FAILPOINTS[i + 1] if i + 1 < len(FAILPOINTS) else ""
            srv = lab.serve(lab.lns, env={"PIPEXCTL_FAILPOINT": nxt})  # reconciles before it accepts
            assert objects(lab.lns.ns) == offloaded(done), f"after the kill at {point}{lab.tails()}"
            st = lab.serve_status(lab.lns)
            assert len(st["tunnels"]) == done and st["reconcile"]["adopted_sessions"] == done, st
            wait_until(lambda: len(ppp_inet_links(lab.lns.ns)) == i + 1, f"call {i + 1} up after the kill at {point}",
                       timeout=120, detail=lab.tails)
        assert len(lab.pppds(lab.lns)) == len(FAILPOINTS)
        ping_all(lab.lns.ns, lab.lns.ns)
        assert objects(l1.ns) == offloaded(len(FAILPOINTS))  # the LAC's daemon had no failpoint
        for section in lab.section_names():
            lab.disconnect(l1, section)
        for inst in (lab.lns, l1):
            wait_until(lambda: objects(inst.ns) == offloaded(0) and not lab.pppds(inst),
                       f"{inst.name}: everything gone after the hang-ups", timeout=90, detail=lab.tails)
    finally:
        lab.teardown()


CONSTANT_RAND = "int rand(void) { return 0x35; }\n"


def test_reused_session_and_tunnel_ids_are_offloaded(tmp_path):
    """xl2tpd picks tunnel and call ids at random.  With `rand source = sys`
    and rand() made constant (LD_PRELOAD) the LNS's xl2tpd gives every
    tunnel and every call the id 0x3535, so a new call reuses the id of the
    one that just ended (same tunnel), then a new tunnel the id of the one
    just closed.  Each is offloaded with its own peer ids, whatever order the
    daemon learns of the old one's end in."""
    src, so = tmp_path / "constrand.c", tmp_path / "constrand.so"
    src.write_text(CONSTANT_RAND)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    ident = 0x3535
    lab = Lab(kernel_mode=False, lns_global="rand source = sys\n", lns_env={"LD_PRELOAD": str(so)}).setup(1)
    try:
        lab.start_all(plugin_options(required=True))
        l1 = lab.lacs[0]
        lab.serve_all([lab.lns, l1])
        seen = []

        def up_and_offloaded(what: str) -> dict:
            wait_until(lambda: ppp_inet_links(lab.lns.ns) and ppp_inet_links(l1.ns), f"PPP up ({what})",
                       timeout=90, detail=lab.tails)
            wait_until(lambda: objects(lab.lns.ns) == offloaded(1) and objects(l1.ns) == offloaded(1),
                       f"one offloaded call on each side ({what})", timeout=30, detail=lab.tails)
            (s,) = ip_l2tp(lab.lns.ns, "session")
            assert (s["tunnel_id"], s["session_id"]) == (ident, ident), s
            (lac_s,) = ip_l2tp(l1.ns, "session")
            # the LNS session's peer ids are the LAC's ids of this call
            assert (s["peer_tunnel_id"], s["peer_session_id"]) == (lac_s["tunnel_id"], lac_s["session_id"])
            ping_all(l1.ns, l1.ns)
            seen.append(s)
            return s

        lab.connect(l1)
        first = up_and_offloaded("first call")
        # the LNS pppd dies: its call ends, the tunnel stays; the next call
        # on that tunnel gets the same id
        (pid,) = lab.pppds(lab.lns)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not lab.pppds(lab.lns) and not lab.pppds(l1), "both pppds gone", detail=lab.tails)
        lab.connect(l1)
        second = up_and_offloaded("a new call with the same session id")
        assert second["peer_session_id"] != first["peer_session_id"] and second["peer_tunnel_id"] == first["peer_tunnel_id"]
        # the LAC closes the tunnel; the next tunnel gets the same tunnel id
        lab.disconnect(l1)
        for inst in (lab.lns, l1):
            wait_until(lambda: objects(inst.ns) == offloaded(0) and not lab.pppds(inst),
                       f"{inst.name}: the closed tunnel gone", timeout=60, detail=lab.tails)
        lab.connect(l1)
        third = up_and_offloaded("a new tunnel with the same tunnel id")
        assert third["peer_tunnel_id"] != first["peer_tunnel_id"]
        assert "already offloaded" not in (lab.lns.dir / "serve.log").read_text()
    finally:
        lab.teardown()


# rand() of the LNS's xl2tpd (`rand source = sys` draws its ids from it, a
# byte per call): the values of $PX_RAND in order, then libc's own
LISTED_RAND = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
static int drawn;
int rand(void) {
    const char *s = getenv("PX_RAND");
    for (int i = 0; s && *s; i++) {
        char *end;
        long v = strtol(s, &end, 0);
        if (i == drawn) { drawn++; return (int)v; }
        s = *end ? end + 1 : end;
    }
    drawn++;
    int (*real)(void) = (int (*)(void))dlsym(RTLD_NEXT, "rand");
    return real();
}
"""


@pytest.mark.one_debian("xl2tpd's ids and the daemon's model of them; the kernel objects are test_offload's on both")
def test_two_live_calls_with_one_call_id_on_two_tunnels_are_both_offloaded(tmp_path):
    """xl2tpd draws a call id at random and does not check it against its
    live calls (L2TPv2 scopes it to the tunnel): in a login storm of 1,000
    calls about 8 pairs share one.  Here the LNS's draws are set: two LACs
    dial one after the other and get tunnels 0x1001 and 0x1002 with call
    0x3535 in each.  The LNS daemon starts once both calls run on their
    ptys; the plugins ask it to move them in.  Both are moved into the
    kernel (the model once kept only the later one, and its pppd alone was
    answered), and one call's end takes only its own session.  (A moved
    call keeps its pty in its pppd; the daemon's pty of a call offloaded at
    its start is keyed by tunnel too: tests/unit/test_serve.py.)"""
    src, so = tmp_path / "listedrand.c", tmp_path / "listedrand.so"
    src.write_text(LISTED_RAND)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src), "-ldl"], check=True)
    # per tunnel: two bytes of its id, then two draws of its tie breaker; per call: two bytes of its id
    draws = "0x01,0x10,0,0,0x35,0x35,0x02,0x10,0,0,0x35,0x35"
    lab = Lab(kernel_mode=False, lns_global="rand source = sys\n",
              lns_env={"LD_PRELOAD": str(so), "PX_RAND": draws}).setup(2)
    try:
        lab.start_all(plugin_options(required=False) + PATIENT)
        l1, l2 = lab.lacs
        lab.serve_all([l1, l2])
        for lac in (l1, l2):
            lab.connect(lac, timeout=60)
            wait_until(lambda: len(ppp_inet_links(lab.lns.ns)) == lab.lacs.index(lac) + 1,
                       f"{lac.name}'s call up on its pty", timeout=90, detail=lab.tails)
        assert objects(lab.lns.ns)["sessions"] == 0
        srv = lab.serve(lab.lns)
        wait_until(lambda: objects(lab.lns.ns)["sessions"] == 2, "both calls moved into the LNS's kernel",
                   timeout=90, detail=lab.tails)
        sessions = sorted((s["tunnel_id"], s["session_id"]) for s in ip_l2tp(lab.lns.ns, "session"))
        assert sessions == [(0x1001, 0x3535), (0x1002, 0x3535)], sessions
        by_tunnel = {s["tunnel_id"]: s for s in ip_l2tp(lab.lns.ns, "session")}
        for lac, tid in ((l1, 0x1001), (l2, 0x1002)):
            (lac_s,) = ip_l2tp(lac.ns, "session")
            assert (by_tunnel[tid]["peer_tunnel_id"], by_tunnel[tid]["peer_session_id"]) == \
                (lac_s["tunnel_id"], lac_s["session_id"]), (lac.name, by_tunnel, lac_s)
        ping_all(lab.lns.ns, lab.lns.ns)
        log = (lab.lns.dir / "serve.log").read_text()
        assert "no call names" not in log and "reused" not in log, log[-3000:]
        lab.disconnect(l1)
        wait_until(lambda: [s["tunnel_id"] for s in ip_l2tp(lab.lns.ns, "session")] == [0x1002],
                   "only l1's session gone", timeout=60, detail=lab.tails)
        ping_all(l2.ns, l2.ns)
        lab.disconnect(l2)
        wait_until(lambda: objects(lab.lns.ns) == offloaded(0) and not lab.pppds(lab.lns),
                   "everything gone after the hang-ups", timeout=90, detail=lab.tails)
        assert srv.poll() is None
    finally:
        lab.teardown()
