"""Attacks and faults against `pipexctl serve`, with real xl2tpd, pppd and
kernel: forged log lines, a requester that is not xl2tpd's pppd, running
out of file descriptors, a socket in a shared directory.  What each did and
what was lost (nothing) is tabled in docs/testing.md.

The forged lines are appended to the log file the daemon follows, as root:
that is what a syslog daemon writes for `logger -t "xl2tpd[PID]" ...` run
by any local user (rsyslog's traditional file format takes the tag as
given); the lab's xl2tpd writes that file itself."""

from __future__ import annotations

import os
import re
import resource
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipexctl import errors
from pipexctl.offload.client import ask
from pipexctl.testing.lab import Lab, kernel_objects as objects, plugin_options, syslogd, xl2tpd_pid
from pipexctl.testing.probe import ppp_peer_addrs

from .conftest import TWINS_STEERED, ip_l2tp, wait_until
from .test_offload import (
    PLUGIN,
    WITH_PLUGIN,
    kernel_objects,
    lab,  # noqa: F401  (the userspace-mode lab fixture, shared)
    offloaded_call,
    ping,
    ppp_up,
    pty_fds,
)

pytestmark = pytest.mark.kernel


def answers(path) -> bool:
    try:
        return ask(path, {"op": "status"})["ok"]
    except (errors.PipexError, OSError, ValueError, KeyError):
        return False


def _fds_of_serve(pid: int) -> str:
    out = subprocess.run(["pgrep", "-f", "pipexctl serve"], capture_output=True, text=True).stdout.split()
    res = []
    for x in out:
        try:
            res.append(f"{x}:{len(os.listdir(f'/proc/{x}/fd'))}:" + open(f"/proc/{x}/limits").read().split("Max open files")[1].split()[0])
        except OSError:
            pass
    return ", ".join(res)


def serve_log(lab, inst) -> str:
    return (inst.dir / "serve.log").read_text()


@pytest.mark.one_debian('log parsing, userspace only')
def test_forged_log_lines_drop_no_call_and_the_real_end_still_cleans_up(lab):
    _, l1 = offloaded_call(lab)
    t = lab.serve_status(lab.lns)["tunnels"][0]
    (cid,) = t["sessions"]
    peer = t["peer"].split(":")[0]
    xpid, other = xl2tpd_pid(lab.lns), xl2tpd_pid(l1)
    forged = [
        f"xl2tpd[{xpid}]: call_close: Call {cid} to {peer} disconnected",  # the real pid: corroboration must say no
        f"xl2tpd[{xpid}]: Connection {t['peer_tunnel_id']} closed to {peer}, port 1701 (forged)",
        "xl2tpd[1]: Using l2tp kernel support.",  # a fake restart: pid 1 is no xl2tpd
        f"xl2tpd[{other}]: Using l2tp kernel support.",  # a second, real, running xl2tpd in this stream
        f"xl2tpd[{xpid}]: death_handler: Fatal signal 15 received",
    ]
    before = kernel_objects(lab.lns.ns)
    assert before[:2] == (1, 1)
    with open(lab.lns.log, "a") as f:
        for line in forged:
            f.write(line + "\n")
            f.flush()
            time.sleep(0.5)
    # the ends no exit confirms are warned about after 10 s (a real end is confirmed by then)
    wait_until(lambda: lab.serve_status(lab.lns)["stats"]["unconfirmed_ends"] >= 2, "the unconfirmed ends warned",
               timeout=60, detail=lambda: serve_log(lab, lab.lns)[-3000:])
    assert kernel_objects(lab.lns.ns) == before, serve_log(lab, lab.lns)[-3000:]
    ok, out = ping(l1.ns, "10.99.100.1")
    assert ok, out
    st = lab.serve_status(lab.lns)
    assert [x["sessions"] for x in st["tunnels"]] == [[cid]]
    log = serve_log(lab, lab.lns)
    assert "kept until pppd exits" in log and "no exit confirms it" in log and "lines tagged xl2tpd[1] ignored" in log
    assert f"a second xl2tpd (pid {other}) writes here: tracked as" in log
    # the call's own end (the LAC hangs up) still removes everything, confirmed by pppd's exit
    lab.disconnect(l1)
    for inst in (lab.lns, l1):
        wait_until(lambda: kernel_objects(inst.ns) == (0, 0, 0) and not lab.pppds(inst),
                   f"{inst.name}: the real end cleaned up", timeout=60, detail=lab.tails)
    assert lab.serve_status(lab.lns)["tunnels"] == []


@pytest.mark.one_debian('log parsing, userspace only')
def test_a_peers_stopccn_text_with_newlines_drops_no_call(lab):
    """A remote peer, not a local user: xl2tpd copies a StopCCN's Result Code
    message into its "Connection closed to ..." line unfiltered, so newlines
    in it become lines of their own in the log, tagged with xl2tpd's real
    pid.  A peer opens a tunnel of its own and closes it with text that ends
    the offloaded call of another peer; the call is kept."""
    _, l1 = offloaded_call(lab)
    t = lab.serve_status(lab.lns)["tunnels"][0]
    (cid,) = t["sessions"]
    peer = t["peer"].split(":")[0]
    xpid = xl2tpd_pid(lab.lns)
    injected = f"xl2tpd[{xpid}]: call_close: Call {cid} to {peer} disconnected"
    before = kernel_objects(lab.lns.ns)
    r = subprocess.run(["ip", "netns", "exec", l1.ns, sys.executable, "-m", "pipexctl.testing.l2tp_peer", "10.99.1.1",
                        "1702", f"bye\n{injected}\nxl2tpd[{xpid}]: ("], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr + lab.tails()
    # the injection is in the log as a line of its own, as xl2tpd wrote it
    wait_until(lambda: injected in lab.lns.log.read_text().splitlines(), "xl2tpd logged the peer's text",
               timeout=30, detail=lab.tails)
    wait_until(lambda: lab.serve_status(lab.lns)["stats"]["unconfirmed_ends"] >= 1, "the unconfirmed end warned",
               timeout=60, detail=lambda: serve_log(lab, lab.lns)[-3000:])
    assert kernel_objects(lab.lns.ns) == before, serve_log(lab, lab.lns)[-3000:]
    ok, out = ping(l1.ns, "10.99.100.1")
    assert ok, out
    assert [x["sessions"] for x in lab.serve_status(lab.lns)["tunnels"]] == [[cid]]
    assert "kept until pppd exits" in serve_log(lab, lab.lns)


def _metrics_refused(lab):
    return ask(lab.serve_socket(lab.lns), {"op": "metrics"})["offload"]["refused"]


def test_a_requester_is_proven_by_its_uids_exe_and_parent(lab, tmp_path):
    lab.start_all(WITH_PLUGIN)
    lab.serve(lab.lns)
    path = lab.serve_socket(lab.lns)
    # setuid-root pppd started by a user: effective uid 0 (SO_PEERCRED says root), real uid not
    code = ("import os,socket,sys; os.setresuid(65534, 0, 0); s=socket.socket(socket.AF_UNIX); "
            "s.connect(sys.argv[1]); s.sendall(b'{\"op\": \"channel\"}\\n'); print(s.recv(65536).decode())")
    r = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=60)
    assert "pppd started by a user" in r.stdout, r.stdout + r.stderr
    assert _metrics_refused(lab).get("pppd_not_started_by_root") == 1
    # the system pppd with the plugin, under a parent that is named xl2tpd but is /bin/sh
    fake = tmp_path / "xl2tpd"
    shutil.copy("/bin/sh", fake)
    # (not exec: the fake must stay pppd's parent)
    r = subprocess.run([str(fake), "-c", f"/usr/sbin/pppd nodetach notty noauth local plugin {PLUGIN} "
                        f"pipexctl_socket {path} pipexctl_required; exit $?"],
                       stdin=subprocess.PIPE, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0, r.stdout + r.stderr
    assert _metrics_refused(lab).get("not_a_pppd_of_xl2tpd") == 1
    assert ip_l2tp(lab.lns.ns, "tunnel") == []


def _serve_with_fd_limit(lab, inst, limit: int, *extra: str) -> subprocess.Popen:
    """`pipexctl serve` for ``inst`` with RLIMIT_NOFILE ``limit`` (soft and
    hard: the daemon cannot raise it), once it answers."""
    out = open(inst.dir / "serve.log", "ab")

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    p = subprocess.Popen(["ip", "netns", "exec", inst.ns, sys.executable, "-m", "pipexctl", "serve", "-v",
                          "--socket", lab.serve_socket(inst), "--log", str(inst.log), "--control", inst.control,
                          *extra], stdout=out, stderr=subprocess.STDOUT, preexec_fn=low_limit, start_new_session=True)
    lab.serves.append(p)
    out.close()
    wait_until(lambda: answers(lab.serve_socket(inst)), "daemon up", timeout=90)
    return p


@pytest.mark.one_debian("the daemon's fd limits, userspace only")
def test_running_out_of_file_descriptors_never_stops_the_daemon(lab):
    lab.start_all(WITH_PLUGIN)
    inst = lab.lns
    p = _serve_with_fd_limit(lab, inst, 64)
    path = lab.serve_socket(inst)
    conns = []
    for _ in range(100):  # idle clients: each accepted one holds an fd for its 5 s request timeout
        s = socket.socket(socket.AF_UNIX)
        s.setblocking(False)
        try:
            s.connect(path)
        except BlockingIOError:  # the backlog is full (the daemon cannot accept): enough
            s.close()
            continue
        conns.append(s)
    wait_until(lambda: "cannot accept a request" in serve_log(lab, inst), "EMFILE seen and logged", timeout=30,
               detail=lambda: f" ({len(conns)} connected; fds {sorted(os.listdir(f'/proc/{p.pid}/fd'))[:3]}, "
                              f"daemon fds {_fds_of_serve(p.pid)}):\n{serve_log(lab, inst)[-3000:]}")
    for s in conns:
        s.close()
    assert p.poll() is None and os.path.exists(path)
    wait_until(lambda: answers(path), "the daemon serves again", timeout=30)
    # and an offload still works afterwards
    lab.serve(lab.lacs[0])
    lab.connect(lab.lacs[0])
    wait_until(lambda: len(ip_l2tp(inst.ns, "session")) == 1, "call offloaded after EMFILE", timeout=60,
               detail=lab.tails)


@pytest.mark.one_debian("the daemon's socket directory, userspace only")
def test_a_socket_in_a_shared_directory_is_refused_and_the_directory_left_alone(lab, tmp_path):
    lab.start_all(WITH_PLUGIN)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    r = subprocess.run(["ip", "netns", "exec", lab.lns.ns, sys.executable, "-m", "pipexctl", "serve",
                        "--socket", str(shared / "x.sock"), "--log", str(lab.lns.log), "--no-proc", "--no-kernel"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "writable by group or others" in r.stderr, r.stderr
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777 and not (shared / "x.sock").exists()
    # /run itself (root's, 0755) may hold the socket; its mode is not touched
    mode = stat.S_IMODE(os.stat("/run").st_mode)
    p = subprocess.Popen(["ip", "netns", "exec", lab.lns.ns, sys.executable, "-m", "pipexctl", "serve",
                          "--socket", "/run/pxtrust.sock", "--state", "/run/pipexctl-trust/state.json",
                          "--log", str(lab.lns.log), "--no-proc", "--no-kernel"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    lab.serves.append(p)
    try:
        wait_until(lambda: os.path.exists("/run/pxtrust.sock"), "serve on /run/pxtrust.sock", timeout=90)
        assert stat.S_IMODE(os.stat("/run").st_mode) == mode
        assert stat.S_IMODE(os.stat("/run/pipexctl-trust").st_mode) == 0o700
        wait_until(lambda: answers("/run/pxtrust.sock"), "it answers", timeout=30)
    finally:
        p.terminate()
        p.wait(30)


# LD_PRELOAD into the LNS's xl2tpd: after it forks a pppd, the parent writes
# the child's pid to $PX_FORKED and stalls 1 s before going on (and so
# before its "Call established ... PID:" line); the child (pppd) runs without it
SLOW_FORK = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
pid_t fork(void) {
    pid_t (*real)(void) = (pid_t (*)(void))dlsym(RTLD_NEXT, "fork");
    pid_t pid = real();
    if (pid == 0) {
        unsetenv("LD_PRELOAD");
    } else if (pid > 0) {
        const char *f = getenv("PX_FORKED");
        FILE *o = f ? fopen(f, "a") : NULL;
        if (o) { fprintf(o, "%d\n", pid); fclose(o); }
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
    }
    return pid;
}
"""


@pytest.mark.one_debian('log parsing, userspace only')
def test_a_forged_call_line_written_before_xl2tpds_own_is_passed_over(tmp_path):
    """The forger sees xl2tpd's new pppd in /proc and writes "Call established
    ... PID: <it>" with ids of its choosing before xl2tpd's own line (xl2tpd
    is slowed after its fork to make the race certain).  xl2tpd's control
    pipe does not list the forged call: the request passes it over, waits
    for xl2tpd's line and offloads the real call with the real peer ids."""
    src, so, forked = tmp_path / "slowfork.c", tmp_path / "slowfork.so", tmp_path / "forked"
    src.write_text(SLOW_FORK)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src), "-ldl"], check=True)
    lab = Lab(kernel_mode=False, lns_env={"LD_PRELOAD": str(so), "PX_FORKED": str(forked)}).setup(1)
    try:
        lab.start_all(WITH_PLUGIN)
        l1 = lab.lacs[0]
        lab.serve_all([lab.lns, l1])
        xpid = xl2tpd_pid(lab.lns)
        lab.control(l1, "c lns")
        wait_until(lambda: forked.exists() and forked.read_text().strip(), "xl2tpd forked a pppd", timeout=60,
                   detail=lab.tails, interval=0.02)
        pid = int(forked.read_text().split()[0])
        with open(lab.lns.log, "a") as f:
            f.write(f"xl2tpd[{xpid}]: Call established with {l1.local}, PID: {pid}, Local: 4242, Remote: 4243, "
                    f"Serial: 9\n")
        wait_until(lambda: f"PID: {pid}, Local:" in lab.lns.log.read_text().split("Serial: 9", 1)[-1],
                   "xl2tpd's own line, after the forged one", timeout=30, detail=lab.tails)
        wait_until(lambda: ppp_up(lab.lns.ns) and ppp_up(l1.ns), "PPP up on both sides", timeout=90, detail=lab.tails)
        wait_until(lambda: objects(lab.lns.ns)["sessions"] == 1, "the call offloaded on the LNS", timeout=30,
                   detail=lambda: serve_log(lab, lab.lns)[-3000:])
        (s,) = ip_l2tp(lab.lns.ns, "session")
        (lac_s,) = ip_l2tp(l1.ns, "session")
        assert s["session_id"] != 4242
        assert (s["peer_tunnel_id"], s["peer_session_id"]) == (lac_s["tunnel_id"], lac_s["session_id"])
        ok, out = ping(l1.ns, "10.99.100.1")
        assert ok, out
        log = serve_log(lab, lab.lns)
        assert f"pppd {pid}: the log of {lab.lns.log} names call 4242" in log, log[-3000:]
        assert "passed over (a forged log line?)" in log
        st = lab.serve_status(lab.lns)["stats"]
        assert st["refused"] == 0 and st["unchecked_calls"] == 0, st  # checked, not taken on the log's word
    finally:
        lab.teardown()


def logger_as_nobody(tag: str, msg: str) -> None:
    """What any local user can write: ``logger`` through syslog, as uid 65534."""
    subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "busybox", "logger", "-t", tag,
                    msg], check=True)


@pytest.mark.one_debian('log parsing, userspace only')
@pytest.mark.parametrize("kind", ["rsyslog", "busybox"])
def test_a_forged_line_with_the_real_call_id_is_caught_by_the_daemons_log_barrier(tmp_path, kind):
    """xl2tpd logs through syslog (rsyslog, or busybox syslogd, writes the
    file the LNS daemon follows).  As nobody, a forger writes through the same syslog a
    line naming xl2tpd's new pppd with the real call id (learned here from
    the LAC's log) and a false peer call id, before xl2tpd's own line
    (xl2tpd slowed 1 s after its fork).  The control pipe lists that call
    id, so only the daemon's barrier, sent after xl2tpd answered and read
    back after xl2tpd's line, shows the two lines: the call stays on its pty
    on the LNS (the LAC's side is offloaded against it), nothing is made,
    the live move asks again and is refused again.  A second call (rsyslog
    only), with no forger until it is offloaded, passes the barrier; a line
    forged for it afterwards changes nothing."""
    src, so, forked = tmp_path / "slowfork.c", tmp_path / "slowfork.so", tmp_path / "forked"
    src.write_text(SLOW_FORK)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src), "-ldl"], check=True)
    lab = Lab(kernel_mode=False, lns_env={"LD_PRELOAD": str(so), "PX_FORKED": str(forked)}, lns_args=("-l",),
              sections=2).setup(1)
    try:
        with syslogd(kind, lab.lns.log):
            lab.start_all(plugin_options(required=False))
            l1 = lab.lacs[0]
            lab.serve_all([lab.lns, l1])
            xpid = xl2tpd_pid(lab.lns)
            start = l1.log.stat().st_size
            lab.control(l1, "c lns")
            wait_until(lambda: forked.exists() and forked.read_text().strip(), "xl2tpd forked a pppd", timeout=60,
                       detail=lab.tails, interval=0.02)
            pid = int(forked.read_text().split()[0])
            # the LAC's "Call established ..., Local: <its call id>, Remote: <the LNS's call id>" came before the fork
            m = re.search(r"Call established with \S+, Local: (\d+), Remote: (\d+)", l1.log.read_text()[start:])
            assert m, lab.tails()
            lac_call, lns_call = int(m[1]), int(m[2])
            false_peer = lac_call % 65535 + 1
            logger_as_nobody(f"xl2tpd[{xpid}]", f"Call established with {l1.local}, PID: {pid}, Local: {lns_call}, "
                                                f"Remote: {false_peer}, Serial: 1")
            wait_until(lambda: f"Remote: {lac_call}, Serial:" in lab.lns.log.read_text(),
                       "xl2tpd's own line, after the forged one", timeout=30, detail=lab.tails)
            wait_until(lambda: ppp_up(lab.lns.ns) and ppp_up(l1.ns), "PPP up on both sides", timeout=90,
                       detail=lab.tails)
            wait_until(lambda: "one of them is forged" in serve_log(lab, lab.lns), "the daemon saw two lines",
                       timeout=30, detail=lambda: serve_log(lab, lab.lns)[-3000:])
            wait_until(lambda: objects(l1.ns)["sessions"] == 1, "the LAC's side offloaded", timeout=30)
            ok, out = ping(l1.ns, "10.99.100.1")
            assert ok, out
            # the plugin's live move asks again (after a second): refused again
            wait_until(lambda: serve_log(lab, lab.lns).count("other peer ids: one of them is forged") >= 2,
                       "the live move's ask refused too", timeout=30, detail=lambda: serve_log(lab, lab.lns)[-3000:])
            assert objects(lab.lns.ns)["sessions"] == 0, ip_l2tp(lab.lns.ns, "session")
            st = lab.serve_status(lab.lns)["stats"]
            assert st["disputed_calls"] == 1 and st["unbarriered_calls"] == 0 and st["offloaded"] == 0, st
            assert "pipexctl[" in lab.lns.log.read_text() and "log barrier" in lab.lns.log.read_text()
            ok, out = ping(l1.ns, "10.99.100.1")
            assert ok, out
            if kind == "busybox":
                return  # the rest is the same through either syslogd

            # the second call: offloaded through the barrier; a line forged after changes nothing
            forked.write_text("")
            start = l1.log.stat().st_size
            lab.control(l1, "c lns2")
            wait_until(lambda: objects(lab.lns.ns)["sessions"] == 1, "the second call offloaded on the LNS",
                       timeout=60, detail=lambda: serve_log(lab, lab.lns)[-3000:])
            (s,) = ip_l2tp(lab.lns.ns, "session")
            m = re.search(r"Call established with \S+, Local: (\d+), Remote: (\d+)", l1.log.read_text()[start:])
            assert m and s["peer_session_id"] == int(m[1]) and s["session_id"] == int(m[2]), (s, m)
            pid2 = int(forked.read_text().split()[0])
            logger_as_nobody(f"xl2tpd[{xpid}]", f"Call established with {l1.local}, PID: {pid2}, Local: {m[2]}, "
                                                f"Remote: {int(m[1]) % 65535 + 1}, Serial: 2")
            wait_until(lambda: lab.serve_status(lab.lns)["stats"]["disputed_calls"] == 2, "the later line seen",
                       timeout=30)
            st = lab.serve_status(lab.lns)["stats"]
            assert st["offloaded"] == 1 and st["unbarriered_calls"] == 0, st
            assert [x["session_id"] for x in ip_l2tp(lab.lns.ns, "session")] == [s["session_id"]]
            wait_until(lambda: len(ppp_peer_addrs(lab.lns.ns)) == 2, "IPCP done for both calls", timeout=60,
                       detail=lab.tails)
            addrs = ppp_peer_addrs(lab.lns.ns)  # each call's client address, pinged from the LNS
            for a in addrs.values():
                ok, out = ping(lab.lns.ns, a)
                assert ok, (a, out)
    finally:
        lab.teardown()


def test_a_plugin_that_gives_up_mid_offload_leaves_nothing_and_its_call_on_the_pty():
    """The LNS daemon stalls 8 s between the session and the channel (a
    daemon starved of CPU); the plugin gives up after 3 s and pppd goes on
    on its pty.  The daemon finds no pppd to take the channel and removes
    what it made; the call carries traffic on the pty (the LAC's side is
    offloaded: a kernel session talks to a userspace xl2tpd as to any peer)."""
    lab = Lab(kernel_mode=False).setup(1)
    try:
        # the start's give-up only: not moved in later (test_live_offload)
        lab.start_all(plugin_options(required=False) + "pipexctl_timeout 3\npipexctl_move 0\n")
        l1 = lab.lacs[0]
        lab.serve(lab.lns, env={"PIPEXCTL_FAILPOINT": "session-created@8"})
        lab.serve(l1)
        lab.connect(l1)
        wait_until(lambda: ppp_up(lab.lns.ns) and ppp_up(l1.ns), "PPP up on both sides", timeout=90, detail=lab.tails)
        wait_until(lambda: lab.serve_status(lab.lns)["stats"]["failed"] == 1, "the LNS offload failed", timeout=60,
                   detail=lambda: serve_log(lab, lab.lns)[-3000:])
        objs = objects(lab.lns.ns)
        assert (objs["tunnels"], objs["sessions"], objs["pppol2tp_sessions"]) == (0, 0, 0), objs
        assert lab.serve_status(lab.lns)["tunnels"] == []
        (pid,) = lab.pppds(lab.lns)
        assert pty_fds(pid), "the LNS pppd is not on its pty"
        assert objects(l1.ns)["sessions"] == 1
        ok, out = ping(l1.ns, "10.99.100.1")
        assert ok, out
        log = serve_log(lab, lab.lns)
        assert "failpoint session-created: stalling 8.0 s" in log and "not taken by its pppd: offload removed" in log
        lab.disconnect(l1)
        wait_until(lambda: not lab.pppds(lab.lns), "the call ended", timeout=60, detail=lab.tails)
    finally:
        lab.teardown()


# Holds table ip pipexctl with nft's "owner" flag (as firewalld's tables are):
# while this process lives, the kernel refuses every transaction of any
# other process on that table (EPERM); it goes with the process
OWNED_TABLE = """
import sys, time
sys.path.insert(0, sys.argv[1])
from pipexctl.offload.steering import _LibNftables
nft = _LibNftables()  # kept: its netlink socket owns the table
rc, err = nft.run("add table ip pipexctl { flags owner ; }\\n"
                  "add chain ip pipexctl pre { type filter hook input priority 0 ; }\\n")
print("held" if rc == 0 else err, flush=True)
time.sleep(3600)
"""


def _owned_table(ns: str) -> subprocess.Popen:
    p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", OWNED_TABLE,
                          str(Path(__file__).resolve().parents[2])], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    assert line == "held", line
    return p


def test_nft_failing_at_start_and_at_sighup_never_stops_the_daemon():
    """Two tunnels from one LAC address and port: before Linux 6.11 the
    second is a twin, offloaded only with nft steering.  While nft fails
    (another process owns table ip pipexctl: from the daemon's start, and
    through a SIGHUP), the twin's call goes on on its pty with a reason and
    the daemon keeps serving; once nft works again the next twin call is
    offloaded.  From 6.11 a twin needs no nft: both calls are offloaded
    while the table is held, and the reload touches no nft."""
    lab, owner = Lab(kernel_mode=False, sections=2).setup(1), None
    try:
        lab.start_all(plugin_options(required=False) + "pipexctl_move 0\n")  # the start's refusals only
        l1 = lab.lacs[0]
        owner = _owned_table(lab.lns.ns)
        srv = lab.serve(lab.lns)
        lab.serve(l1)
        first, second = lab.section_names()
        lab.connect(l1, section=first)
        wait_until(lambda: objects(lab.lns.ns)["sessions"] == 1, "the first call offloaded", timeout=60,
                   detail=lab.tails)
        lab.connect(l1, section=second)
        wait_until(lambda: len(ppp_peer_addrs(l1.ns)) == 2, "both calls up", timeout=90, detail=lab.tails)
        if TWINS_STEERED:
            wait_until(lambda: lab.serve_status(lab.lns)["stats"]["failed"] == 1, "the twin's offload failed",
                       timeout=60, detail=lambda: serve_log(lab, lab.lns)[-3000:])
        else:
            wait_until(lambda: lab.serve_status(lab.lns)["stats"]["offloaded"] == 2, "the twin offloaded",
                       timeout=60, detail=lambda: serve_log(lab, lab.lns)[-3000:])
        assert objects(lab.lns.ns)["sessions"] == (1 if TWINS_STEERED else 2)
        for addr in ppp_peer_addrs(l1.ns).values():
            ok, out = ping(l1.ns, addr)
            assert ok, (addr, out)
        at = len(serve_log(lab, lab.lns))
        os.kill(srv.pid, 1)  # SIGHUP: the reconcile's nft transaction fails too
        wait_until(lambda: "reloaded (SIGHUP)" in serve_log(lab, lab.lns)[at:], "the reload", timeout=60,
                   detail=lambda: serve_log(lab, lab.lns)[-3000:])
        assert srv.poll() is None and answers(lab.serve_socket(lab.lns))
        log = serve_log(lab, lab.lns)
        assert ("nftables rejected the steering" in log) == TWINS_STEERED and "Traceback" not in log, log[-3000:]
        # nft works again (the table's owner exits): the twin's next call is offloaded, its steering written
        owner.kill()
        owner.wait()
        lab.disconnect(l1, section=second)
        wait_until(lambda: len(ppp_peer_addrs(l1.ns)) == 1, "the twin's call ended", timeout=60, detail=lab.tails)
        lab.connect(l1, section=second)
        wait_until(lambda: objects(lab.lns.ns)["sessions"] == 2, "the twin's next call offloaded",
                   timeout=90, detail=lambda: serve_log(lab, lab.lns)[-3000:])
        assert objects(lab.lns.ns)["nft_rules"] == (3 if TWINS_STEERED else 0)
        wait_until(lambda: len(ppp_peer_addrs(l1.ns)) == 2, "both calls up again", timeout=90, detail=lab.tails)
        for addr in ppp_peer_addrs(l1.ns).values():
            ok, out = ping(l1.ns, addr)
            assert ok, (addr, out)
        assert srv.poll() is None
    finally:
        if owner is not None and owner.poll() is None:
            owner.kill()
            owner.wait()
        lab.teardown()


CALLS = 60  # with RLIMIT_NOFILE 64: the trust issue's proof


@pytest.mark.one_debian("the daemon's fd limits, userspace only")
@pytest.mark.long("about 7 min under TCG; test_running_out_of_file_descriptors covers the daemon's side")
def test_sixty_calls_past_the_fd_limit_stay_on_their_ptys_and_nothing_leaks():
    """RLIMIT_NOFILE 64 on the LNS daemon, 60 calls in 60 tunnels (4 LACs,
    15 rounds of four): an offloaded call holds its pty and its tunnel
    holds a socket, so the limit is met after a few calls.  The calls past
    it stay on their ptys with a reason; the daemon keeps serving; the
    kernel holds exactly the offloaded calls; every call carries ping; all
    hung up, nothing is left, and the next call is offloaded."""
    lab = Lab(kernel_mode=False, sections=CALLS // 4).setup(4)
    try:
        lab.start_all(plugin_options(required=False) + "pipexctl_timeout 30\npipexctl_move 0\n")
        p = _serve_with_fd_limit(lab, lab.lns, 64, "--wait", "30")
        for lac in lab.lacs:
            lab.serve(lac, "--wait", "30")
        offsets = {lac.name: lac.log.stat().st_size for lac in lab.lacs}
        for n, section in enumerate(lab.section_names(), 1):
            for lac in lab.lacs:
                lab.control(lac, f"c {section}")
            for lac in lab.lacs:
                lab.wait_log(lac, "Call established", offset=offsets[lac.name], count=n, timeout=60)
        wait_until(lambda: len(ppp_peer_addrs(lab.lns.ns)) == CALLS, f"{CALLS} PPP links up", timeout=600,
                   detail=lambda: lab.tails(600))
        log = serve_log(lab, lab.lns)
        offloaded = len(re.findall(r"of pppd \d+ offloaded in ", log))
        assert p.poll() is None
        assert 0 < offloaded < CALLS, log[-3000:]
        assert "out of file descriptors" in log or "Too many open files" in log, log[-3000:]
        objs = objects(lab.lns.ns)
        assert objs["sessions"] == objs["pppol2tp_sessions"] == objs["tunnels"] == offloaded, (objs, offloaded)
        on_pty = [pid for pid in lab.pppds(lab.lns) if pty_fds(pid)]
        assert len(on_pty) == CALLS - offloaded
        for peer in ppp_peer_addrs(lab.lns.ns).values():
            ok, out = ping(lab.lns.ns, peer, count=2)
            assert ok, (peer, out)
        for section in lab.section_names():
            for lac in lab.lacs:
                lab.disconnect(lac, section)
            time.sleep(0.3)
        wait_until(lambda: objects(lab.lns.ns)["tunnels"] == 0 and not lab.pppds(lab.lns), "all ended", timeout=300,
                   detail=lab.tails)
        st = lab.serve_status(lab.lns)
        assert st["tunnels"] == [] and p.poll() is None
        assert st["stats"]["offloaded"] == offloaded
        lab.connect(lab.lacs[0])
        wait_until(lambda: objects(lab.lns.ns)["sessions"] == 1, "the next call offloaded", timeout=60,
                   detail=lambda: serve_log(lab, lab.lns)[-3000:])
    finally:
        lab.teardown(keep_as="test_sixty_calls_past_the_fd_limit")
