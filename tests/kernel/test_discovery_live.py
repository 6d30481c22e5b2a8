"""Discovery against real xl2tpd + pppd (LNS and two LACs in namespaces).

Checked against independent views: xl2tpd-control (xl2tpd's own client),
`ip l2tp show session` (iproute2) and /proc's process tree.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pipexctl.discovery.discovery import Discovery

from .conftest import Watcher, ip_l2tp

pytestmark = pytest.mark.kernel


def xl2tpd_control_status(lab) -> dict[int, list[int]]:
    """peer tunnel id -> our call ids, from xl2tpd-control (not our client)."""
    r = subprocess.run(["xl2tpd-control", "-d", "-c", lab.lns.control, "status-lns", "default"],
                       capture_output=True, text=True)
    out: dict[int, list[int]] = {}
    cur = {}
    for ln in r.stderr.splitlines():
        if ".id=" in ln and "calls" not in ln:
            t = int(ln.split("=")[1])
            out[t] = []
            cur["t"] = t
        elif ".calls." in ln and ln.split("=")[0].endswith(".id"):
            out[cur["t"]].append(int(ln.split("=")[1]))
    return out


def _snapshot(lab, inst):
    d = Discovery([str(inst.log)], [inst.control], netns=inst.ns)
    try:
        return d.snapshot()
    finally:
        d.close()


def test_discover_lns_and_lac(lab):
    l1, l2 = lab.lacs
    lab.connect(l1)
    lab.connect(l2)
    lab.wait_log(lab.lns, "Call established", count=2)
    t0 = time.monotonic()
    snap = _snapshot(lab, lab.lns)
    latency = time.monotonic() - t0
    print(f"LNS snapshot took {latency * 1000:.0f} ms after the second 'Call established' line")
    print(json.dumps(snap.as_dict()["calls"], indent=1))
    calls = snap.calls
    assert len(calls) == 2 and len(snap.tunnels) == 2
    # both ids of tunnel and call, and the pppd PID, for every call
    for c in calls:
        assert c.role == "lns" and c.section == "default"
        assert None not in (c.tunnel_id, c.peer_tunnel_id, c.call_id, c.peer_call_id, c.pppd_pid)
        assert c.data_path == ("kernel" if lab.kernel_mode else "userspace")
    # xl2tpd-control agrees (peer tunnel id -> our call ids)
    assert xl2tpd_control_status(lab) == {c.peer_tunnel_id: [c.call_id] for c in calls}
    # /proc agrees: the PIDs are pppd children of the LNS xl2tpd
    assert sorted(c.pppd_pid for c in calls) == sorted(lab.pppds(lab.lns))
    # the kernel agrees
    ksess = {(s["tunnel_id"], s["session_id"]) for s in ip_l2tp(lab.lns.ns, "session") if s["session_id"]}
    if lab.kernel_mode:
        assert ksess == {(c.tunnel_id, c.call_id) for c in calls}
    else:
        assert ksess == set()
    # the LAC side: ids from its own log, the pppd PID matched through /proc
    lac = _snapshot(lab, l1)
    assert len(lac.calls) == 1
    (lc,) = lac.calls
    mine = next(c for c in calls if c.peer == l1.local)
    assert (lc.role, lc.tunnel_id, lc.peer_tunnel_id) == ("lac", mine.peer_tunnel_id, mine.tunnel_id)
    assert (lc.call_id, lc.peer_call_id) == (mine.peer_call_id, mine.call_id)
    assert lc.pppd_pid == lab.pppds(l1)[0]
    assert lc.data_path == ("kernel" if lab.kernel_mode else "userspace")


def test_watch_events_once_in_order(lab):
    l1, l2 = lab.lacs
    lab.connect(l1)
    lab.wait_log(lab.lns, "Call established", count=1)
    w = Watcher(Discovery([str(lab.lns.log)], [lab.lns.control], netns=lab.lns.ns))
    got, wait_for = w.got, w.wait_for
    wait_for(lambda: [e.event for e in got][:2] == ["TunnelUp", "CallUp"], "initial state")
    first = got[1].call
    # a second LAC comes and goes
    lab.connect(l2)
    wait_for(lambda: sum(e.event == "CallUp" for e in got) == 2, "CallUp of lac2")
    second = [e for e in got if e.event == "CallUp"][1].call
    lab.disconnect(l2)
    wait_for(lambda: any(e.event == "TunnelDown" and e.tunnel.tunnel_id == second.tunnel_id for e in got), "TunnelDown")
    # lac1's pppd on the LNS is killed
    os.kill(first.pppd_pid, signal.SIGKILL)
    wait_for(lambda: any(e.event == "CallDown" and e.call.call_id == first.call_id for e in got), "CallDown of lac1")
    # the LNS xl2tpd is killed outright (no log line): /proc tells
    lab.kill(lab.lns, signal.SIGKILL)
    wait_for(lambda: any(e.event == "TunnelDown" and e.tunnel.tunnel_id == first.tunnel_id for e in got), "TunnelDown lac1")
    w.stop()
    seq = [(e.event, getattr(e, "call", None) and e.call.call_id, getattr(e, "tunnel", None) and e.tunnel.tunnel_id)
           for e in got if e.event != "CallUpdated"]
    print("\n".join(map(str, seq)))
    # each up and each down exactly once
    for kind in ("CallUp", "CallDown", "TunnelUp", "TunnelDown"):
        keys = [s[1] or s[2] for s in seq if s[0] == kind]
        assert len(keys) == len(set(keys)), (kind, seq)
    order = [s[0] for s in seq]
    assert order == ["TunnelUp", "CallUp", "TunnelUp", "CallUp", "CallDown", "TunnelDown", "CallDown", "TunnelDown"]
    # ... and the downs belong to the right objects, in order
    assert seq[4][1] == second.call_id and seq[5][2] == second.tunnel_id
    assert seq[6][1] == first.call_id and seq[7][2] == first.tunnel_id


@pytest.mark.one_debian("the CLI's rendering of discovery; test_discover_lns_and_lac reads both kernels")
def test_discover_cli_json_transcript(lab):
    l1, _ = lab.lacs
    lab.connect(l1)
    lab.wait_log(lab.lns, "Call established")
    r = subprocess.run(["ip", "netns", "exec", lab.lns.ns, sys.executable, "-m", "pipexctl", "discover", "--json",
                        "--log", str(lab.lns.log), "--control", lab.lns.control], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    print(r.stdout)
    out = json.loads(r.stdout)
    (c,) = out["calls"]
    assert c["pppd_pid"] == lab.pppds(lab.lns)[0]
    r = subprocess.run(["ip", "netns", "exec", lab.lns.ns, sys.executable, "-m", "pipexctl", "discover",
                        "--log", str(lab.lns.log), "--control", lab.lns.control], capture_output=True, text=True)
    print(r.stdout)
    assert str(c["call_id"]) in r.stdout and "lns" in r.stdout
