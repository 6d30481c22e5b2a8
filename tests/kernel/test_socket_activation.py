"""`pipexctl serve` on a socket made by someone else, as pipexctl.socket
makes it (systemd's socket activation: fd 3, LISTEN_PID, LISTEN_FDS), with
real xl2tpd, pppd and kernel.  The test holds the listening socket the way
systemd does, so it outlives the daemon: a restart during a transfer keeps
the running call, and a call dialled while no daemon runs waits in the
backlog and is offloaded by the next one.  (Not systemd itself: the guest's
PID 1 is a shell; the unit files are checked by systemd-analyze on the host.)"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from .conftest import ip_l2tp, wait_until
from .test_offload import (
    PLUGIN,
    lab,  # noqa: F401  (the userspace-mode lab fixture, shared)
    ping,
    ppp_up,
)

pytestmark = [pytest.mark.kernel, pytest.mark.one_debian("the daemon's restart on a held socket, userspace only")]

# pppd waits for the daemon's answer up to 40 s: a restart under emulation
# takes about 10 s before the new daemon accepts
PLUGIN_OPTS = f"plugin {PLUGIN}\npipexctl_socket {{sock}}\npipexctl_required\npipexctl_timeout 40\n"


def activated_serve(lab, inst, lst: socket.socket) -> subprocess.Popen:
    """`pipexctl serve` with ``lst`` as fd 3, as systemd starts it (`ip netns
    exec` keeps the pid, so LISTEN_PID is the daemon's)."""
    out = open(inst.dir / "serve.log", "ab")
    cmd = (f"LISTEN_PID=$$ LISTEN_FDS=1 exec ip netns exec {inst.ns} {sys.executable} -m pipexctl serve -v "
           f"--log {inst.log} --control {inst.control} --state {Path(lab.serve_socket(inst)).with_name('state.json')}")
    p = subprocess.Popen(["sh", "-c", cmd], stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                         pass_fds=(3,), preexec_fn=lambda: os.dup2(lst.fileno(), 3))
    out.close()
    lab.serves.append(p)
    return p


def test_a_restart_on_a_socket_systemd_holds_keeps_calls_and_offloads_one_dialled_meanwhile(lab):
    lab.start_all(PLUGIN_OPTS)
    path = lab.serve_socket(lab.lns)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    lst = socket.socket(socket.AF_UNIX)
    lst.bind(path)
    os.chmod(path, 0o600)
    lst.listen(256)
    first = activated_serve(lab, lab.lns, lst)
    l1, l2 = lab.lacs
    lab.serve_all([l1, l2])
    wait_until(lambda: "serving on" in (lab.lns.dir / "serve.log").read_text(), "the LNS daemon up", timeout=90)
    assert "(socket from systemd)" in (lab.lns.dir / "serve.log").read_text()
    lab.connect(l1)
    wait_until(lambda: ppp_up(lab.lns.ns) and ppp_up(l1.ns) and len(ip_l2tp(lab.lns.ns, "session")) == 1,
               "call 1 offloaded", detail=lab.tails)

    # a ping through call 1 for the whole restart
    pinger = {}

    def run_ping():
        pinger["r"] = subprocess.run(["ip", "netns", "exec", l1.ns, "ping", "-c", "120", "-i", "0.25", "-W", "2",
                                      "10.99.100.1"], capture_output=True, text=True)

    t = threading.Thread(target=run_ping)
    t.start()
    os.killpg(first.pid, signal.SIGTERM)
    first.wait(30)
    assert os.path.exists(path), "the socket is systemd's: it outlives the daemon"
    # call 2 dialled while no daemon runs: its pppd connects to the backlog and waits
    lab.connect(l2)
    second = activated_serve(lab, lab.lns, lst)
    wait_until(lambda: len(ip_l2tp(lab.lns.ns, "session")) == 2 and ppp_up(l2.ns), "call 2 offloaded by the new daemon",
               timeout=120, detail=lab.tails)
    t.join(60)
    st = lab.serve_status(lab.lns)
    assert st["reconcile"]["adopted_sessions"] == 1, st["reconcile"]
    assert sorted(len(x["sessions"]) for x in st["tunnels"]) == [1, 1] and st["stats"]["offloaded"] == 1
    out = pinger["r"].stdout
    assert " 0% packet loss" in out or " 0.0% packet loss" in out, out[-500:]
    ok, out = ping(l2.ns, "10.99.100.1")
    assert ok, out
    assert second.poll() is None
    lst.close()
