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
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pipexctl.discovery.control import write_request
from pipexctl.testing.lab import pty_fds

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


CONF = Path("/etc/xl2tpd/xl2tpd.conf")


def lns_config(extra_options: str = "") -> None:
    """The LNS: Debian's xl2tpd.service with an LNS section, pppd's stock options."""
    CONF.write_text("[global]\nforce userspace = yes\n\n[lns default]\nip range = 10.99.100.2-10.99.100.20\n"
                    "local ip = 10.99.100.1\nrequire authentication = no\nrefuse chap = yes\nrefuse pap = yes\n"
                    "name = lns\nlength bit = yes\npppoptfile = /etc/ppp/options.xl2tpd\n")
    Path("/etc/ppp/options.xl2tpd").write_text("noauth\nnodefaultroute\nlcp-echo-interval 30\n" + extra_options)


def start_lac(foreground: bool) -> int:
    """The LAC: its own namespace and xl2tpd; ``foreground``: ``xl2tpd -D``
    writing to /run/sdlac/xl2tpd.log, else daemonized, writing through
    syslog() into the journal like Debian's xl2tpd.  Its pid."""
    sh("ip", "netns", "add", LAC_NS)
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
    pidfile = d / "xl2tpd.pid"
    pidfile.unlink(missing_ok=True)
    argv = ["ip", "netns", "exec", LAC_NS, "xl2tpd", *(["-D"] if foreground else []), "-c", str(d / "xl2tpd.conf"),
            "-p", str(pidfile), "-C", str(d / "l2tp-control")]
    with open(d / "xl2tpd.log", "ab") as log:
        subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip().isdigit(), "the LAC's xl2tpd pid file",
               timeout=30)
    pid = int(pidfile.read_text())
    listening = (lambda: "Listening on IP address" in (d / "xl2tpd.log").read_text()) if foreground else \
        (lambda: "Listening on IP address" in journal(f"_PID={pid}"))
    wait_until(listening, "the LAC's xl2tpd up", timeout=30)
    return pid


def stop_lac() -> None:
    subprocess.run(["pkill", "-f", "xl2tpd.*/run/sdlac"], capture_output=True)
    subprocess.run(["ip", "netns", "del", LAC_NS], capture_output=True)


def test_quickstart_deb_on_a_systemd_boot_offloads_a_call_and_survives_a_daemon_restart(packaged):
    assert os.readlink("/proc/1/exe").endswith("/systemd"), "this test needs systemd as PID 1 (guest_init systemd)"
    # Debian's default install has no syslog daemon; the set-up's rsyslog (for a
    # shell-guest test) is masked in this boot (vm.SYSTEMD_MASKED)
    assert sh("systemctl", "is-active", "rsyslog", check=False).strip() != "active" and not Path("/var/log/syslog").exists(), \
        "journald must be the only log here (Debian's default install)"
    assert sh("systemctl", "is-active", "systemd-journald", "xl2tpd").split() == ["active", "active"], state()
    deb, _ = packaged
    lac = None
    conf_saved = CONF.read_text()
    try:
        lns_config()
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

        lac = True
        start_lac(foreground=True)
        lac_control("c lns")
        wait_until(lambda: ppp_up_root() and l2tp("session") == 1, "the call up and offloaded",
                   timeout=90, detail=state)

        # offloaded by the packaged daemon, which learnt the call from the journal
        # alone (the LNS's "Call established ... PID:" line), on the kernel channel
        pid = lns_pppds()
        assert len(pid) == 1, (pid, state())
        assert not pty_fds(pid[0]), "the LNS pppd still talks on its pty"
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
        # the new daemon read the journal on from the cursor the old one saved at
        # its stop (not the whole boot again), with the call it knew
        main = sh("systemctl", "show", "-p", "MainPID", "--value", "pipexctl.service").strip()
        # the unit's Nice=: a login storm's pppds must not keep the daemon every login waits for off the CPUs
        nice = int(sh("systemctl", "show", "-p", "Nice", "--value", "pipexctl.service").strip())
        assert nice < 0 and os.getpriority(os.PRIO_PROCESS, int(main)) == nice, state()
        assert "journal:xl2tpd: resumed at its saved cursor with 1 call(s) known" in \
            journal("-u", "pipexctl", f"_PID={main}"), state()
        firsts = [int(n) for n in re.findall(r"first read of (\d+) log line", journal("-u", "pipexctl"))]
        assert len(firsts) == 2 and firsts[0] > 0 and firsts[1] < firsts[0], (firsts, state())

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
        if lac:
            stop_lac()
        if Path("/usr/bin/pipexctl").exists():
            subprocess.run(["/usr/bin/pipexctl", "offload", "disable"], capture_output=True)
        subprocess.run(["systemctl", "disable", "--now", "pipexctl.service", "pipexctl.socket"], capture_output=True)
        subprocess.run(["apt-get", "purge", "-y", "pipexctl"], capture_output=True)
        CONF.write_text(conf_saved)
        subprocess.run(["systemctl", "restart", "xl2tpd"], capture_output=True)


def test_two_xl2tpd_in_one_journal_each_keep_their_own_calls(tmp_path):
    """``--log journal-id:xl2tpd`` reads every xl2tpd of the journal as one
    stream: Debian's xl2tpd.service (the LNS, with its control pipe) and a
    second, daemonized xl2tpd (the LAC, in a namespace) both write there
    through syslog(), told apart by journald's ``_PID``.  The LAC writes
    first (the LNS is stopped meanwhile), so the stream's first xl2tpd is
    not the control pipe's.  The LNS call is offloaded, checked against the
    LNS's control pipe; the LAC's call stays known, on its own; the hang-up
    ends both and leaves nothing.  (Run with the checkout's daemon and
    plugin: the first test purged the package.)"""
    import sys

    from pipexctl.testing.lab import plugin_path

    assert os.readlink("/proc/1/exe").endswith("/systemd"), "this test needs systemd as PID 1 (guest_init systemd)"
    sock = "/run/pxmulti/serve.sock"
    conf_saved = CONF.read_text()
    serve = None
    lac = False
    out = tmp_path / "serve.log"

    def status() -> dict:
        return json.loads(sh(sys.executable, "-m", "pipexctl", "status", "--socket", sock, "--json"))

    def detail() -> str:
        return state() + out.read_text()[-4000:]

    try:
        lns_config(f"plugin {plugin_path()}\npipexctl_socket {sock}\npipexctl_timeout 30\n")
        sh("systemctl", "restart", "xl2tpd")
        with out.open("ab") as f:
            serve = subprocess.Popen([sys.executable, "-m", "pipexctl", "serve", "-v", "--socket", sock,
                                      "--log", "journal-id:xl2tpd", "--control", "/var/run/xl2tpd/l2tp-control"],
                                     stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(lambda: "serving on" in out.read_text(), "the daemon serving", timeout=120, detail=detail)
        # the LAC's xl2tpd writes to the journal while the LNS is down, then the LNS starts
        sh("systemctl", "stop", "xl2tpd")
        lac = True
        lac_pid = start_lac(foreground=False)
        sh("systemctl", "start", "xl2tpd")
        root_ns = os.readlink("/proc/1/ns/net")
        (lns_pid,) = [int(p) for p in sh("pgrep", "-x", "xl2tpd").split() if os.readlink(f"/proc/{p}/ns/net") == root_ns]
        assert lns_pid != lac_pid
        lac_control("c lns")
        wait_until(lambda: ppp_up_root() and l2tp("session") == 1, "the LNS call up and offloaded", timeout=120,
                   detail=detail)
        (pppd,) = lns_pppds()
        assert not pty_fds(pppd), "the LNS pppd still talks on its pty"
        ok, text = ping()
        assert ok, text + detail()

        def calls() -> dict:
            return {c["role"]: c for c in status()["calls"]}

        wait_until(lambda: set(calls()) == {"lac", "lns"}, "both xl2tpd's calls known", timeout=60, detail=detail)
        st = status()
        inst = {i["pid"]: i["instance"] for i in st["instances"] if i["pid"]}
        assert set(inst) == {lns_pid, lac_pid}, st["instances"]
        assert inst[lac_pid] == "journal-id:xl2tpd" and inst[lns_pid] == f"journal-id:xl2tpd@{lns_pid}", inst
        by_role = {c["role"]: c for c in st["calls"]}
        assert by_role["lns"]["instance"] == inst[lns_pid] and by_role["lns"]["path"] == "offloaded", st["calls"]
        assert by_role["lac"]["instance"] == inst[lac_pid], st["calls"]
        assert st["stats"]["unchecked_calls"] == 0, st["stats"]
        # a reload asks the control pipe again: the LNS's answer is the LNS's, and
        # ends nothing of the LAC's (before: applied to the stream's first xl2tpd).
        # Sent to the process group, as `kill -HUP -PGID` does: journalctl, the
        # daemon's child, dies of it and is started again after its last entry
        os.killpg(serve.pid, signal.SIGHUP)
        wait_until(lambda: "reloaded (SIGHUP)" in out.read_text(), "the reload done", timeout=60, detail=detail)
        wait_until(lambda: re.search(r"journalctl exited \(status -?\d+\): started again in \d+ s, after the last "
                                     r"entry read", out.read_text()), "journalctl restarted", timeout=30, detail=detail)
        assert set(calls()) == {"lac", "lns"} and calls()["lns"]["path"] == "offloaded", detail()
        assert calls()["lac"]["instance"] == inst[lac_pid], detail()
        ok, text = ping()
        assert ok, text + detail()
        # the LAC hangs up: both sides' calls end, each in its own instance, and nothing is left
        lac_control("d lns")
        wait_until(lambda: l2tp("session") == 0 and l2tp("tunnel") == 0 and not lns_pppds(),
                   "the call ended and its tunnel removed", timeout=90, detail=detail)
        wait_until(lambda: status()["calls"] == [], "no call left in discovery", timeout=60, detail=detail)
        assert serve.poll() is None, detail()
    finally:
        if serve is not None:
            os.killpg(serve.pid, 15)
            serve.wait(30)
        if lac:
            stop_lac()
        CONF.write_text(conf_saved)
        subprocess.run(["systemctl", "restart", "xl2tpd"], capture_output=True)
