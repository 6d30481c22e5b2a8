"""The offload of userspace-mode xl2tpd calls, end to end on the real kernel:
xl2tpd + pppd + pipexctl.so + `pipexctl serve` in namespaces.

Independent checks: iproute2 (`ip l2tp show`, `ip -s link`), `ss`, nft's
own listing, xl2tpd-control, /proc/<pppd>/fd.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipexctl.kernel.backend import NetlinkBackend
from pipexctl.offload import statefile
from pipexctl.offload.client import ask
from pipexctl.testing.lab import Lab, iperf_received, plugin_path, pty_fds
from pipexctl.testing.probe import ip_json, ppp_peer_addrs

from .conftest import TWINS_STEERED, ip_l2tp, wait_until

pytestmark = pytest.mark.kernel

PLUGIN = plugin_path()
WITH_PLUGIN = f"plugin {PLUGIN}\npipexctl_socket {{sock}}\npipexctl_required\n"


def sh(*c):
    r = subprocess.run(list(c), capture_output=True, text=True)
    return r.stdout + r.stderr


def ppp_up(ns):
    return "10.99.100." in sh("ip", "-n", ns, "-br", "addr")


def ping(ns, addr, count=5, size=56):
    r = subprocess.run(["ip", "netns", "exec", ns, "ping", "-c", str(count), "-i", "0.2", "-s", str(size), "-W", "3",
                        addr], capture_output=True, text=True)
    return r.returncode == 0, r.stdout


def cpu_ticks(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])


def nft_rules(ns):
    out = sh("ip", "netns", "exec", ns, "nft", "-j", "list", "table", "ip", "pipexctl")
    try:
        items = json.loads(out)["nftables"]
    except (ValueError, KeyError):
        return None
    return [i["rule"] for i in items if "rule" in i]


def status_lns_bytes(lab):
    out = sh("xl2tpd-control", "-d", "-c", lab.lns.control, "status-lns", "default")
    return sum(int(ln.split("=")[1]) for ln in out.splitlines() if "_bytes=" in ln)


def offloaded_call(lab, *lns_args):
    """xl2tpd + plugin + `pipexctl serve` on the LNS and lac1, one call up.

    Returns (the LNS daemon's process, lac1)."""
    lab.start_all(WITH_PLUGIN)
    l1 = lab.lacs[0]
    if lns_args:
        srv = lab.serve(lab.lns, *lns_args)
        lab.serve(l1)
    else:
        srv, _ = lab.serve_all([lab.lns, l1])  # both start at once
    lab.connect(l1)
    wait_until(lambda: ppp_up(lab.lns.ns) and ppp_up(l1.ns), "PPP up on both sides", detail=lab.tails)
    return srv, l1


@pytest.fixture
def lab(request):
    lab = Lab(kernel_mode=False).setup(2)
    yield lab
    lab.teardown(keep_as=request.node.name)


def test_offload_both_sides(lab):
    _, l1 = offloaded_call(lab, "--metrics", "127.0.0.1:9469")

    # the kernel carries the session on both sides (xl2tpd itself is in userspace mode)
    (ls,) = [s for s in ip_l2tp(lab.lns.ns, "session")]
    (cs,) = [s for s in ip_l2tp(l1.ns, "session")]
    assert (ls["session_id"], ls["peer_session_id"]) == (cs["peer_session_id"], cs["session_id"])
    # pppd talks on no pty (the plugin keeps a copy, unread, for a move back) ...
    for pid in lab.pppds(lab.lns) + lab.pppds(l1):
        assert pty_fds(pid) == [], pid
    # ... and xl2tpd does not spin on its pty master (it did, at ~97 % of a CPU,
    # before the daemon held the slave end): a busy loop, not a timing target
    t0 = [cpu_ticks(i.proc.pid) for i in (lab.lns, l1)]
    time.sleep(2)
    spent = [cpu_ticks(i.proc.pid) - t for i, t in zip((lab.lns, l1), t0)]
    assert max(spent) < 50, f"xl2tpd busy-looping: {spent} ticks in 2 s"
    # traffic: ping, then a bulk transfer counted by the kernel but not by xl2tpd
    ok, out = ping(l1.ns, "10.99.100.1")
    assert ok, out
    assert "pipexctl: kernel channel for tunnel" in (lab.lns.dir / "pppd.log").read_text()
    # the plugin's ack carried its CLOCK_MONOTONIC stamps, and they fit between
    # the daemon's reply and its read of the ack (one clock in the machine),
    # and its thread's wait for a CPU in that span, from the kernel's schedstat
    stamped = re.compile(r"offloaded in \d+ ms \(.*hand-off \d+\); as pppd saw it \d+ ms \(ms: its wake .*, "
                         r"its own wait for a CPU \d+\)")
    wait_until(lambda: stamped.search((lab.lns.dir / "serve.log").read_text()), "the offload's line with pppd's stamps",
               timeout=10, detail=lambda: (lab.lns.dir / "serve.log").read_text()[-3000:])
    before_x = status_lns_bytes(lab)
    link0 = ip_json(lab.lns.ns, "-s", "link", "show", "ppp0")[0]["stats64"]["rx"]["bytes"]
    ok, out = ping(l1.ns, "10.99.100.1", count=20, size=1200)
    assert ok, out
    link1 = ip_json(lab.lns.ns, "-s", "link", "show", "ppp0")[0]["stats64"]["rx"]["bytes"]
    assert link1 - link0 >= 20 * 1200
    assert status_lns_bytes(lab) == before_x, "xl2tpd's own per-call counters must stay flat"
    # iperf3 through the offloaded session: the kernel session's own counters
    # (generic netlink, as `ip l2tp` cannot show them) grow by at least what
    # iperf3 moved, and xl2tpd still counts nothing
    with contextlib.closing(NetlinkBackend(netns=lab.lns.ns)) as nl:
        rx0 = nl.session_get(ls["tunnel_id"], ls["session_id"]).stats.rx_bytes
        moved = iperf_received(lab.lns.ns, l1.ns, "10.99.100.1", 3)["bytes"]
        rx1 = nl.session_get(ls["tunnel_id"], ls["session_id"]).stats.rx_bytes
    assert moved > 100_000 and rx1 - rx0 >= moved, (moved, rx1 - rx0)
    assert status_lns_bytes(lab) == before_x
    # the daemon's Prometheus endpoint, scraped by curl, and its metrics op
    # (what `pipexctl stat --serve` prints) carry the same kernel counters
    from prometheus_client.parser import text_string_to_metric_families

    body = sh("ip", "netns", "exec", lab.lns.ns, "curl", "-sf", "http://127.0.0.1:9469/metrics")
    val = {(s.name, s.labels.get("session_id")): s.value for f in text_string_to_metric_families(body)
           for s in f.samples}
    sid = str(ls["session_id"])
    assert val[("pipexctl_offloaded_sessions", None)] == 1 and val[("pipexctl_offloads_total", None)] == 1
    assert val[("pipexctl_session_rx_bytes_total", sid)] >= rx1 >= moved
    m = ask(lab.serve_socket(lab.lns), {"op": "metrics"})
    (ms,) = m["sessions"]
    assert ms["session_id"] == ls["session_id"] and ms["rx_bytes"] >= val[("pipexctl_session_rx_bytes_total", sid)]
    assert {"role": "lns", "data_path": "kernel", "count": 1} in m["calls"]
    # the kernel tunnel sits on a socket like xl2tpd's kernel mode makes:
    # xl2tpd's address and port, connected to the peer; no rule moves a packet
    for inst, me, him in ((lab.lns, "10.99.1.1", "10.99.1.2"), (l1, "10.99.1.2", "10.99.1.1")):
        assert f"{me}:1701 {him}:1701" in " ".join(sh("ip", "netns", "exec", inst.ns, "ss", "-Huan").split())
        assert nft_rules(inst.ns) is None
    # discovery sees the kernel data path
    d = sh("ip", "netns", "exec", lab.lns.ns, sys.executable, "-m", "pipexctl", "discover", "--json",
           "--log", str(lab.lns.log), "--control", lab.lns.control)
    (call,) = json.loads(d)["calls"]
    assert call["data_path"] == "kernel" and call["call_id"] == ls["session_id"]

    # disconnect from the LAC: everything of the call and tunnel goes; the
    # LAC's CDN and StopCCN reach the LNS's xl2tpd through the relay
    relayed = lab.serve_status(lab.lns)["datapath"]["relayed"]
    lab.disconnect(l1)
    wait_until(lambda: ip_l2tp(lab.lns.ns, "tunnel") == [] and ip_l2tp(l1.ns, "tunnel") == [], "kernel tunnels gone", detail=lab.tails)
    assert lab.serve_status(lab.lns)["datapath"]["relayed"] > relayed

    # a new call afterwards is offloaded again
    lab.connect(l1)
    wait_until(lambda: ppp_up(lab.lns.ns) and ppp_up(l1.ns), "PPP up again", detail=lab.tails)
    assert len(ip_l2tp(lab.lns.ns, "session")) == 1
    ok, out = ping(l1.ns, "10.99.100.1")
    assert ok, out


def only_the_lns_offloads(lab):
    """The LNS's pppd with the plugin, the LAC's plain; both xl2tpd started.
    Returns the LAC."""
    lab.write_configs("")
    (lab.lns.dir / "options").write_text((lab.lns.dir / "options").read_text()
                                         + WITH_PLUGIN.format(sock=lab.serve_socket(lab.lns)))
    lab.start(lab.lns)
    lab.start(lab.lacs[0])
    return lab.lacs[0]


def test_two_lacs_behind_one_address_each_call_goes_to_its_own_port(lab):
    """Two LAC xl2tpd on one address, ports 1701 and 1702 (two clients
    behind one NAT): the LNS log names only the address for a call, the
    control pipe says which tunnel holds it, and each kernel tunnel sends
    to its own peer port (the second one went to 1701 and its PPP never
    came up)."""
    l1 = only_the_lns_offloads(lab)
    l1b = lab.add_lac_beside(l1, 1702)
    lab.serve(lab.lns)
    lab.connect(l1)
    lab.connect(l1b)
    wait_until(lambda: len(ppp_peer_addrs(lab.lns.ns)) == 2, "both calls up", timeout=60, detail=lab.tails)
    assert len(ip_l2tp(lab.lns.ns, "session")) == 2
    for pid in lab.pppds(lab.lns):
        assert pty_fds(pid) == [], pid
    socks = " ".join(sh("ip", "netns", "exec", lab.lns.ns, "ss", "-Huan").split())
    assert "10.99.1.1:1701 10.99.1.2:1701" in socks and "10.99.1.1:1701 10.99.1.2:1702" in socks, socks
    for addr in ppp_peer_addrs(lab.lns.ns).values():
        ok, out = ping(lab.lns.ns, addr)
        assert ok, (addr, out)
    lab.disconnect(l1b)
    lab.disconnect(l1)
    wait_until(lambda: ip_l2tp(lab.lns.ns, "tunnel") == [] and not lab.pppds(lab.lns), "both ended", timeout=60,
               detail=lab.tails)
    assert lab.serve_status(lab.lns)["tunnels"] == []


def test_one_side_offloaded_interoperates_with_plain_xl2tpd(lab):
    l1 = only_the_lns_offloads(lab)
    lab.serve(lab.lns)
    lab.connect(l1)
    wait_until(lambda: ppp_up(lab.lns.ns) and ppp_up(l1.ns), "PPP up", detail=lab.tails)
    assert len(ip_l2tp(lab.lns.ns, "session")) == 1 and ip_l2tp(l1.ns, "session") == []
    ok, out = ping(l1.ns, "10.99.100.1", count=10)
    assert ok, out


def test_no_daemon_falls_back_to_the_pty_or_fails_when_required(lab):
    optional = f"plugin {PLUGIN}\npipexctl_socket /run/nobody-here.sock\npipexctl_timeout 2\n"
    lab.start_all(optional)
    l1 = lab.lacs[0]
    lab.connect(l1)
    wait_until(lambda: ppp_up(lab.lns.ns) and ppp_up(l1.ns), "PPP up on the pty", detail=lab.tails)
    ok, out = ping(l1.ns, "10.99.100.1")
    assert ok, out
    assert ip_l2tp(lab.lns.ns, "session") == []
    assert "continuing on the pty" in (lab.lns.dir / "pppd.log").read_text()
    # required: pppd refuses to run without the kernel channel
    l2 = lab.lacs[1]
    (l2.dir / "options").write_text((l2.dir / "options").read_text() + "pipexctl_required\n")
    lab.connect(l2)
    lab.wait_log(l2, "pppd exited for call", timeout=30)
    assert "pipexctl_required is set" in (l2.dir / "pppd.log").read_text()


def kernel_objects(ns):
    """What an independent tool sees: iproute2's tunnels and sessions, nft's rules
    (only a second tunnel from the same peer address and port has any: 3)."""
    return len(ip_l2tp(ns, "tunnel")), len(ip_l2tp(ns, "session")), len(nft_rules(ns) or [])


def test_killed_pppd_and_killed_daemon_leave_nothing(lab):
    srv, l1 = offloaded_call(lab)
    (pid,) = lab.pppds(lab.lns)
    os.kill(pid, signal.SIGKILL)
    # the session dies with pppd's socket; xl2tpd's CDN ends the LAC's call
    # (through the LAC daemon's relay)
    wait_until(lambda: [s for s in ip_l2tp(lab.lns.ns, "session")] == [], "session gone with pppd", detail=lab.tails)
    wait_until(lambda: lab.pppds(l1) == [], "the LAC's call ended by the LNS's CDN", detail=lab.tails)
    # a new call, then the daemon is killed outright: the kernel keeps the
    # session (pppd holds its socket and a copy of the tunnel's) and data flows
    lab.connect(l1)
    wait_until(lambda: len(ip_l2tp(lab.lns.ns, "session")) == 1, "offloaded again", detail=lab.tails)
    wait_until(lambda: ppp_up(lab.lns.ns) and ppp_up(l1.ns), "PPP up again", detail=lab.tails)
    os.killpg(srv.pid, signal.SIGKILL)
    srv.wait(10)
    assert kernel_objects(lab.lns.ns) == (1, 1, 0)
    ok, out = ping(l1.ns, "10.99.100.1")
    assert ok, out
    # while the daemon is down the call ends (pppd killed): the kernel drops
    # session and tunnel with pppd's sockets
    (pid,) = lab.pppds(lab.lns)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: ip_l2tp(lab.lns.ns, "tunnel") == [], "tunnel gone with the last pppd holding it", detail=lab.tails)
    lab.serve(lab.lns)  # restart: reconcile
    wait_until(lambda: kernel_objects(lab.lns.ns) == (0, 0, 0), "nothing left after the restart", detail=lab.tails)
    st = lab.serve_status(lab.lns)
    assert st["tunnels"] == [] and st["reconcile"]["adopted_sessions"] == 0
    # and a new call is offloaded by the restarted daemon
    lab.disconnect(l1)
    wait_until(lambda: lab.pppds(l1) == [], "LAC pppd gone", detail=lab.tails)
    lab.connect(l1)
    wait_until(lambda: kernel_objects(lab.lns.ns) == (1, 1, 0), "offloaded by the new daemon", detail=lab.tails)


def test_restarted_daemon_adopts_running_sessions(lab):
    srv, l1 = offloaded_call(lab)
    before = ip_l2tp(lab.lns.ns, "session")
    (pid,) = lab.pppds(lab.lns)
    # SIGTERM: a graceful stop leaves the offloaded session running
    os.killpg(srv.pid, signal.SIGTERM)
    srv.wait(20)
    assert kernel_objects(lab.lns.ns) == (1, 1, 0)
    ok, out = ping(l1.ns, "10.99.100.1")
    assert ok, out
    state = statefile.read(str(Path(lab.serve_socket(lab.lns)).with_name("state.json")))
    assert state is not None and [s.pppd_pid for t in state.tunnels for s in t.sessions] == [pid]
    # restart: the session is adopted, the tunnel socket taken back from pppd;
    # the log is read on from where the stop saved it, with the call known
    assert Path(lab.serve_socket(lab.lns)).with_name("discovery.json").exists()
    srv = lab.serve(lab.lns)
    assert f"{lab.lns.log}: resumed at offset" in (lab.lns.dir / "serve.log").read_text()
    st = lab.serve_status(lab.lns)
    assert st["reconcile"]["adopted_sessions"] == 1 and st["reconcile"]["removed_sessions"] == 0, st
    (t,) = st["tunnels"]
    assert t["holds_socket"] and t["sessions"] == [before[0]["session_id"]]
    assert ip_l2tp(lab.lns.ns, "session") == before and kernel_objects(lab.lns.ns) == (1, 1, 0)
    ok, out = ping(l1.ns, "10.99.100.1", count=10, size=1200)
    assert ok, out
    # the new daemon holds the call's pty again (by its recorded path): pppd
    # talks on none, and xl2tpd does not spin on its master end
    assert pty_fds(pid) == []
    t0 = cpu_ticks(lab.lns.proc.pid)
    time.sleep(2)
    assert cpu_ticks(lab.lns.proc.pid) - t0 < 50, "xl2tpd busy-looping after the restart"
    # SIGHUP reconciles the state file now: a recorded tunnel whose pppd is
    # gone (made here with the library, as a crashed daemon would leave it)
    # is removed, the live call is not touched
    from pipexctl.model import Endpoint, PwType, SessionSpec, TunnelSpec

    with contextlib.closing(NetlinkBackend(netns=lab.lns.ns)) as nl:
        nl.tunnel_create(TunnelSpec(tunnel_id=999, peer_tunnel_id=998, version=2,
                                    local=Endpoint.parse("10.99.1.1:40000"), remote=Endpoint.parse("10.99.1.2:40001")))
        nl.session_create(SessionSpec(tunnel_id=999, session_id=5, peer_session_id=6, version=2, pw_type=PwType.ppp))
    sp = Path(lab.serve_socket(lab.lns)).with_name("state.json")
    state = statefile.read(str(sp))
    assert state is not None
    orphan = statefile.TunnelRecord(instance=state.tunnels[0].instance, tunnel_id=999, peer_tunnel_id=998,
                                    local="10.99.1.1", peer="10.99.1.2", peer_port=40001, local_port=40000)
    with open(sp, "ab") as f:  # the journal's lines of a tunnel and session a crashed daemon recorded
        f.write(statefile.tunnel_line(orphan) + statefile.session_line(orphan.instance, 999, statefile.SessionRecord(
            call_id=5, peer_call_id=6, pppd_pid=999999, role="lns")))
    assert kernel_objects(lab.lns.ns)[:2] == (2, 2)
    os.killpg(srv.pid, signal.SIGHUP)
    wait_until(lambda: kernel_objects(lab.lns.ns) == (1, 1, 0), "the orphan removed by SIGHUP", detail=lab.tails)
    st = lab.serve_status(lab.lns)
    assert st["reconcile"]["removed_sessions"] + st["reconcile"]["removed_tunnels"] >= 1, st["reconcile"]
    assert "reloaded (SIGHUP)" in (lab.lns.dir / "serve.log").read_text()
    assert ip_l2tp(lab.lns.ns, "session") == before
    ok, out = ping(l1.ns, "10.99.100.1")
    assert ok, out
    # kill -9 this time, restart again: adopted again
    os.killpg(srv.pid, signal.SIGKILL)
    srv.wait(10)
    lab.serve(lab.lns)
    assert lab.serve_status(lab.lns)["reconcile"]["adopted_sessions"] == 1
    # the adopted call hung up from the LNS side: everything goes on both sides
    sid = before[0]["session_id"]
    lab.control(lab.lns, f"h {sid}")
    wait_until(lambda: ip_l2tp(lab.lns.ns, "session") == [] and ip_l2tp(l1.ns, "session") == [],
               "sessions gone after the LNS hung up", detail=lab.tails)
    wait_until(lambda: pid not in lab.pppds(lab.lns), "the hung-up call's pppd exited", detail=lab.tails)


def test_killed_xl2tpd_while_offloaded_leaves_nothing(lab):
    srv, l1 = offloaded_call(lab)
    pids = lab.pppds(lab.lns)
    lab.kill(lab.lns, signal.SIGKILL)
    # the daemon sees xl2tpd gone (its calls with it) and removes what it made
    wait_until(lambda: kernel_objects(lab.lns.ns) == (0, 0, 0), "LNS kernel state and rules removed", timeout=60, detail=lab.tails)
    # pppd loses its channel when the session is deleted, and exits
    wait_until(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids), "LNS pppd exited", timeout=60, detail=lab.tails)
    st = lab.serve_status(lab.lns)
    assert st["tunnels"] == []
    # the LAC notices through its hello timeout much later; hang it up now and
    # stop its daemon with --teardown-on-exit semantics checked below
    lab.disconnect(l1)
    wait_until(lambda: kernel_objects(l1.ns) == (0, 0, 0), "LAC side cleaned after its disconnect", timeout=60, detail=lab.tails)


def test_teardown_on_exit_removes_everything(lab):
    lab.start_all(WITH_PLUGIN)
    srv = lab.serve(lab.lns, "--teardown-on-exit")
    l1 = lab.lacs[0]
    lab.serve(l1)
    lab.connect(l1)
    wait_until(lambda: kernel_objects(lab.lns.ns) == (1, 1, 0), "offloaded", detail=lab.tails)
    os.killpg(srv.pid, signal.SIGTERM)
    srv.wait(20)
    assert ip_l2tp(lab.lns.ns, "tunnel") == [] and nft_rules(lab.lns.ns) is None  # the table itself is gone


def _ask(path, payload: bytes, uid=None):
    code = ("import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
            "s.sendall(sys.argv[2].encode('latin-1')); print(s.recv(65536).decode())")
    argv = [sys.executable, "-c", code, path, payload.decode("latin-1")]
    if uid is not None:
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True)


@pytest.mark.one_debian("the daemon's request checks, userspace only")
def test_socket_refuses_what_it_must(lab):
    lab.start_all(WITH_PLUGIN)
    lab.serve(lab.lns)
    path = lab.serve_socket(lab.lns)
    st = os.stat(path)
    assert st.st_mode & 0o777 == 0o600 and os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
    # another uid cannot even connect
    r = _ask(path, b'{"op": "channel"}\n', uid=65534)
    assert r.returncode != 0 and "Permission denied" in r.stderr
    # with the directory opened up, the daemon itself refuses by SO_PEERCRED
    os.chmod(os.path.dirname(path), 0o755)
    os.chmod(path, 0o666)
    r = _ask(path, b'{"op": "channel"}\n', uid=65534)
    assert "permission denied: only root" in r.stdout
    # root, but not a pppd of xl2tpd
    r = _ask(path, b'{"op": "channel"}\n')
    assert "is not a pppd started by xl2tpd" in r.stdout
    # malformed and oversized requests: an error reply, and the daemon keeps serving
    assert "malformed request" in _ask(path, b"{not json\n").stdout
    assert "request too large" in _ask(path, b"x" * 10000 + b"\n").stdout
    assert "unknown op" in _ask(path, b'{"op": "rm -rf /"}\n').stdout
    r = _ask(path, b'{"op": "status"}\n')
    st = json.loads(r.stdout)
    assert st["ok"] and st["stats"]["refused"] >= 5


@pytest.mark.one_debian("control relayed to xl2tpd and its HELLO timeout: the relay's datagrams are the same on both kernels (test_datapath checks them on each)")
@pytest.mark.long("170 s: 75 s of idle HELLOs, then xl2tpd's timeout")
def test_hellos_pass_and_a_vanished_peer_is_removed_at_hello_timeout(lab):
    """xl2tpd 1.3.18 sends HELLO about every 60 s (no option to change it):
    after 75 s idle, a HELLO round went through the relay to xl2tpd.
    Then the peer vanishes (its veth goes down): xl2tpd's HELLO goes
    unanswered until 'Maximum retries exceeded', and everything of that
    tunnel goes on both sides (iproute2, not pipexctl, says so)."""
    _, l1 = offloaded_call(lab)
    relayed0 = lab.serve_status(lab.lns)["datapath"]["relayed"]
    time.sleep(75)
    for inst in (lab.lns, l1):
        log = inst.log.read_text()
        assert "Maximum retries exceeded" not in log and "Connection closed" not in log, log[-2000:]
    assert len(ip_l2tp(lab.lns.ns, "session")) == 1 and len(ip_l2tp(l1.ns, "session")) == 1
    assert lab.serve_status(lab.lns)["datapath"]["relayed"] > relayed0  # the peer's HELLO or ZLB
    ok, out = ping(l1.ns, "10.99.100.1")
    assert ok, out
    sh("ip", "-n", lab.lns.ns, "link", "set", "l1", "down")
    # the next HELLO within 60 s, then xl2tpd's retransmissions (about 30 s)
    for inst in (lab.lns, l1):
        wait_until(lambda: kernel_objects(inst.ns) == (0, 0, 0) and not lab.pppds(inst),
                   f"{inst.name}: the vanished peer's tunnel removed", timeout=240, detail=lab.tails)
        assert "Maximum retries exceeded" in inst.log.read_text()


ppp_addrs = ppp_peer_addrs


@pytest.mark.one_debian("the daemon's concurrency; its kernel requests are the other offload tests'")
@pytest.mark.long('170 s under TCG; the offload of concurrent calls is also in test_offload_world and the churn')
def test_twenty_concurrent_calls_from_four_lacs_all_offloaded():
    """Under TCG 45 processes start at once on 2 emulated CPUs, so the plugin
    and the daemon wait up to 30 s here (default 5): the test proves every
    call is offloaded; latency under load is measured by `make bench`."""
    lab = Lab(kernel_mode=False, sections=5).setup(4)
    try:
        lab.start_all(WITH_PLUGIN + "pipexctl_timeout 30\n")
        for inst in [lab.lns, *lab.lacs]:
            lab.serve(inst, "--wait", "30")
        offsets = {lac.name: lac.log.stat().st_size for lac in lab.lacs}
        for n, section in enumerate(lab.section_names(), 1):
            for lac in lab.lacs:  # four xl2tpds dial at once, five rounds
                lab.control(lac, f"c {section}")
            for lac in lab.lacs:
                lab.wait_log(lac, "Call established", offset=offsets[lac.name], count=n, timeout=60)
            try:
                wait_until(lambda: len(ppp_addrs(lab.lns.ns)) == 4 * n, f"round {n} up", timeout=120, detail=lab.tails)
            except AssertionError:
                for p in lab.serves:  # every thread's stack into serve.log
                    os.killpg(p.pid, signal.SIGUSR1)
                time.sleep(2)
                raise
        wait_until(lambda: len(ppp_addrs(lab.lns.ns)) == 20 and all(len(ppp_addrs(lac.ns)) == 5 for lac in lab.lacs),
                   "20 PPP links up", timeout=120, detail=lambda: lab.tails(600))
        # each call is a kernel session on both sides; per LAC one tunnel sits
        # on xl2tpd's port, and so do its four twins (same address pair) from
        # Linux 6.11; before, they are steered by the three rules of the twins' maps
        rules, twins = (3, 16) if TWINS_STEERED else (0, 0)
        assert kernel_objects(lab.lns.ns) == (20, 20, rules)
        for lac in lab.lacs:
            assert kernel_objects(lac.ns) == (5, 5, rules)
        st = lab.serve_status(lab.lns)
        assert sum(t["steered"] for t in st["tunnels"]) == twins and st["datapath"]["twins"] == twins
        for pid in lab.pppds(lab.lns):
            assert pty_fds(pid) == [], pid
        # every client answers over its own offloaded session
        peers = list(ppp_addrs(lab.lns.ns).values())
        assert len(set(peers)) == 20
        for peer in peers:
            ok, out = ping(lab.lns.ns, peer, count=2)
            assert ok, (peer, out)
        st = lab.serve_status(lab.lns)
        assert st["stats"]["offloaded"] == 20 and st["stats"]["failed"] == 0
        before_x = status_lns_bytes(lab)
        for peer in peers:
            ping(lab.lns.ns, peer, count=2, size=1000)
        assert status_lns_bytes(lab) == before_x, "xl2tpd carried data that should be in the kernel"
        # all hung up: nothing is left anywhere
        for section in lab.section_names():
            for lac in lab.lacs:
                lab.disconnect(lac, section)
            time.sleep(0.3)
        for inst in [lab.lns, *lab.lacs]:
            wait_until(lambda: kernel_objects(inst.ns) == (0, 0, 0), f"{inst.name} clean", timeout=90, detail=lab.tails)
    finally:
        lab.teardown(keep_as="test_twenty_concurrent_calls")
