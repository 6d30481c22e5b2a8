"""The quick start's Debian-package path, run on a Debian boot as it is.

This test runs in its own guest boot with systemd as PID 1
(``guest_init("systemd")``): journald is the only log (no rsyslog, Debian's
default install), xl2tpd is Debian's own ``xl2tpd.service`` (its init
script, started by systemd in its own order, logging through syslog() into
the journal), and pipexctl is the ``.deb`` that `make deb` built, installed
with apt and started with ``systemctl enable --now`` as docs/quickstart.md
says, under every hardening option of the shipped unit.  Then the three
units are stopped and started again in systemd's own order, as at boot,
while the peer dials.

The LNS is the guest's own network namespace (xl2tpd.service's); the LAC
is an xl2tpd in a namespace this test creates, joined by a veth.  pppd's
options are Debian's stock ones (no noccp/novj).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from pipexctl.discovery.control import write_request

from .conftest import wait_until

pytestmark = [pytest.mark.kernel, pytest.mark.guest_init("systemd")]

LAC_NS = "sdlac"


def sh(*c, check=True, timeout=300):
    r = subprocess.run(list(c), capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"{c}: {r.stdout[-3000:]}{r.stderr[-3000:]}"
    return r.stdout + r.stderr


def l2tp(what: str) -> int:
    """How many kernel tunnels or sessions the LNS (this namespace) has, by iproute2."""
    return sh("ip", "l2tp", "show", what).count("Tunnel " if what == "tunnel" else "Session ")


def journal(*sel: str) -> str:
    return sh("journalctl", "-b", "--no-pager", "-o", "short-precise", *sel, check=False)


def ppp_up_root() -> bool:
    return "10.99.100.1" in sh("ip", "-br", "addr")


def ping(count=5):
    r = subprocess.run(["ip", "netns", "exec", LAC_NS, "ping", "-c", str(count), "-i", "0.2", "-W", "3", "10.99.100.1"],
                       capture_output=True, text=True)
    return r.returncode == 0, r.stdout


def lac_control(line: str) -> None:
    os.close(write_request("/run/sdlac/l2tp-control", (line + "\n").encode(), 10, 10))


def lns_pppds() -> list[int]:
    return [int(p) for p in sh("pgrep", "-x", "pppd", check=False).split()
            if Path(f"/proc/{p}/ns/net").exists() and os.readlink(f"/proc/{p}/ns/net") == os.readlink("/proc/1/ns/net")]


def state() -> str:
    """What the failure message shows: units, journals, kernel objects."""
    return "\n".join([
        sh("systemctl", "--no-pager", "status", "pipexctl.service", "pipexctl.socket", "xl2tpd.service", check=False)[-3000:],
        journal("-u", "pipexctl", "-n", "60"), journal("-u", "xl2tpd", "-n", "60"),
        Path("/run/sdlac/xl2tpd.log").read_text()[-2000:] if Path("/run/sdlac/xl2tpd.log").exists() else "",
        sh("ip", "l2tp", "show", "session", check=False)])


def test_quickstart_deb_on_a_systemd_boot_offloads_a_call_and_survives_a_daemon_restart(packaged):
    assert os.readlink("/proc/1/exe").endswith("/systemd"), "this test needs systemd as PID 1 (guest_init systemd)"
    assert not Path("/etc/rsyslog.conf").exists() and not Path("/var/log/syslog").exists(), \
        "journald must be the only log here (Debian's default install)"
    assert sh("systemctl", "is-active", "systemd-journald", "xl2tpd").split() == ["active", "active"], state()
    deb, _ = packaged
    lac = None
    conf = Path("/etc/xl2tpd/xl2tpd.conf")
    conf_saved = conf.read_text()
    try:
        # the LNS: Debian's xl2tpd.service with an LNS section, pppd's stock options
        conf.write_text("[global]\nforce userspace = yes\n\n[lns default]\nip range = 10.99.100.2-10.99.100.20\n"
                        "local ip = 10.99.100.1\nrequire authentication = no\nrefuse chap = yes\nrefuse pap = yes\n"
                        "name = lns\nlength bit = yes\npppoptfile = /etc/ppp/options.xl2tpd\n")
        Path("/etc/ppp/options.xl2tpd").write_text("noauth\nnodefaultroute\nlcp-echo-interval 30\n")
        sh("systemctl", "restart", "xl2tpd")

        # the quick start, as written: apt install the .deb, check, enable, offload enable
        sh("apt-get", "install", "-y", str(deb), timeout=600)  # a local file: nothing to download
        sh("pipexctl", "check")
        sh("systemctl", "enable", "--now", "pipexctl.socket", "pipexctl.service")
        # --timeout 30: a pppd that asks during a daemon restart waits pipexctl_timeout
        # for the next daemon; under TCG on a slow host a start takes ~10 s (5 s default)
        out = sh("pipexctl", "offload", "enable", "--timeout", "30")
        assert "plugin pipexctl.so" in Path("/etc/ppp/options.xl2tpd").read_text(), out
        wait_until(lambda: sh("systemctl", "is-active", "pipexctl.service", check=False).strip() == "active",
                   "pipexctl.service active (READY=1 after its reconcile)", timeout=120, detail=state)

        # the LAC: its own namespace and xl2tpd
        sh("ip", "netns", "add", LAC_NS)
        lac = True
        sh("ip", "-n", LAC_NS, "link", "set", "lo", "up")
        sh("ip", "link", "add", "sdl1", "type", "veth", "peer", "name", "v0", "netns", LAC_NS)
        sh("ip", "addr", "add", "10.99.1.1/24", "dev", "sdl1")
        sh("ip", "link", "set", "sdl1", "up")
        sh("ip", "-n", LAC_NS, "addr", "add", "10.99.1.2/24", "dev", "v0")
        sh("ip", "-n", LAC_NS, "link", "set", "v0", "up")
        d = Path("/run/sdlac")
        d.mkdir(exist_ok=True)
        (d / "options").write_text("noauth\nnodefaultroute\nipcp-accept-local\nipcp-accept-remote\n"
                                   f"logfile {d}/pppd.log\n")
        (d / "xl2tpd.conf").write_text(
            "[global]\nport = 1701\nlisten-addr = 10.99.1.2\nforce userspace = yes\n\n[lac lns]\nlns = 10.99.1.1\n"
            "require authentication = no\nrefuse chap = yes\nrefuse pap = yes\nname = lac\nlength bit = yes\n"
            f"redial = no\npppoptfile = {d}/options\n")
        log = open(d / "xl2tpd.log", "ab")
        subprocess.Popen(["ip", "netns", "exec", LAC_NS, "xl2tpd", "-D", "-c", str(d / "xl2tpd.conf"),
                          "-p", str(d / "xl2tpd.pid"), "-C", str(d / "l2tp-control")],
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        wait_until(lambda: "Listening on IP address" in (d / "xl2tpd.log").read_text(), "the LAC's xl2tpd up",
                   timeout=30)
        lac_control("c lns")
        wait_until(lambda: ppp_up_root() and l2tp("session") == 1, "the call up and offloaded",
                   timeout=90, detail=state)

        # offloaded by the packaged daemon, which learnt the call from the journal
        # alone (the LNS's "Call established ... PID:" line), on the kernel channel
        pid = lns_pppds()
        assert len(pid) == 1, (pid, state())
        assert not [f for f in os.listdir(f"/proc/{pid[0]}/fd") if os.readlink(f"/proc/{pid[0]}/fd/{f}")
                    .startswith("/dev/pts")], "the LNS pppd still holds its pty"
        ok, text = ping()
        assert ok, text + state()
        wait_until(lambda: "offloaded in" in journal("-u", "pipexctl"), "the daemon's 'offloaded' record",
                   timeout=30, detail=state)
        st = json.loads(sh("pipexctl", "status", "--json"))
        assert [c["path"] for c in st["calls"]] == ["offloaded"], st
        pppd_log = journal("_COMM=pppd")
        assert "pipexctl: kernel channel for tunnel" in pppd_log, pppd_log[-3000:]
        # stock options: compression turned off on the kernel channel, and said so
        assert "ACFC, PFC, VJ and CCP compression off" in pppd_log, pppd_log[-3000:]
        # the record carries fields: `journalctl -u pipexctl CALL_ID=...`
        call_id, tunnel_id = st["calls"][0]["call_id"], st["calls"][0]["tunnel_id"]
        assert "offloaded" in journal("-u", "pipexctl", f"CALL_ID={call_id}")
        assert "offloaded" in journal(f"TUNNEL_ID={tunnel_id}")

        # a restart of the daemon under a running ping: the call stays, is adopted
        p = subprocess.Popen(["ip", "netns", "exec", LAC_NS, "ping", "-c", "100", "-i", "0.2", "-W", "2",
                              "10.99.100.1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(3)
        sh("systemctl", "restart", "pipexctl.service")
        out, _ = p.communicate(timeout=120)
        assert " 0% packet loss" in out, out + state()
        wait_until(lambda: sh("systemctl", "is-active", "pipexctl.service", check=False).strip() == "active",
                   "pipexctl.service active again", timeout=120, detail=state)
        st = json.loads(sh("pipexctl", "status", "--json"))
        assert [c["path"] for c in st["calls"]] == ["offloaded"], st
        assert l2tp("session") == 1

        # systemctl reload: SIGHUP, everything read again, the call kept
        sh("systemctl", "reload", "pipexctl.service")
        wait_until(lambda: "reloaded (SIGHUP)" in journal("-u", "pipexctl"), "the reload done", timeout=60,
                   detail=state)
        assert [c["path"] for c in json.loads(sh("pipexctl", "status", "--json"))["calls"]] == ["offloaded"]
        ok, text = ping()
        assert ok, text + state()

        def hang_up():
            lac_control("d lns")
            wait_until(lambda: l2tp("session") == 0 and not lns_pppds(), "the call ended", timeout=60,
                       detail=state)
            wait_until(lambda: l2tp("tunnel") == 0, "the tunnel removed", timeout=90, detail=state)

        # the peer hangs up: everything goes, the journal says so
        hang_up()
        assert "ended" in journal("-u", "pipexctl")
        assert sh("systemctl", "is-active", "pipexctl.service").strip() == "active"
        assert "Failed" not in sh("systemctl", "--no-pager", "status", "pipexctl.service", check=False)

        # a call dialled while the daemon restarts waits on systemd's socket and
        # is offloaded by the new daemon
        sh("systemctl", "restart", "--no-block", "pipexctl.service")
        lac_control("c lns")
        wait_until(lambda: ppp_up_root() and l2tp("session") == 1, "the call dialled during the restart offloaded",
                   timeout=120, detail=state)
        wait_until(lambda: sh("systemctl", "is-active", "pipexctl.service", check=False).strip() == "active",
                   "pipexctl.service active again", timeout=120, detail=state)
        main = sh("systemctl", "show", "-p", "MainPID", "--value", "pipexctl.service").strip()
        assert "offloaded in" in journal("-u", "pipexctl", f"_PID={main}"), state()
        hang_up()

        # systemd's own order, as at boot: all three stopped, then multi-user.target
        # started in one transaction while the peer dials at once; the call is
        # offloaded (the plugin socket is there before xl2tpd's first pppd)
        sh("systemctl", "stop", "pipexctl.service", "pipexctl.socket", "xl2tpd.service")
        assert sh("systemctl", "is-active", "pipexctl.socket", check=False).strip() == "inactive"
        sh("systemctl", "start", "--no-block", "multi-user.target")
        lac_control("c lns")
        wait_until(lambda: ppp_up_root() and l2tp("session") == 1, "the call dialled during the start offloaded",
                   timeout=120, detail=state)
        assert sh("systemctl", "is-active", "pipexctl.socket", "pipexctl.service", "xl2tpd").split() == \
            ["active"] * 3, state()
        st = json.loads(sh("pipexctl", "status", "--json"))
        assert [c["path"] for c in st["calls"]] == ["offloaded"], st
        ok, text = ping()
        assert ok, text + state()
    finally:
        subprocess.run(["pkill", "-f", "xl2tpd.*/run/sdlac"], capture_output=True)
        if lac:
            subprocess.run(["ip", "netns", "del", LAC_NS], capture_output=True)
        if Path("/usr/bin/pipexctl").exists():
            subprocess.run(["/usr/bin/pipexctl", "offload", "disable"], capture_output=True)
        subprocess.run(["systemctl", "disable", "--now", "pipexctl.service", "pipexctl.socket"], capture_output=True)
        subprocess.run(["apt-get", "purge", "-y", "pipexctl"], capture_output=True)
        conf.write_text(conf_saved)
        subprocess.run(["systemctl", "restart", "xl2tpd"], capture_output=True)
