"""Control-plane benchmark, run inside the guest (not a test: asserts nothing).

Two session kinds, because Debian 12's iproute2 can only make Ethernet
pseudowires (each an l2tpethN device, whose registration dominates):

- library vs ``ip l2tp``: Ethernet sessions on both sides, 100 and 1,000;
- the library alone: PPP-type sessions (what the offload makes; no device),
  100 / 1,000 / 10,000 in one tunnel and across 1,000 tunnels, with the
  per-operation curve.

1. Sessions created + deleted per second: the library (one generic-netlink
   socket reused) against one ``ip l2tp add/del session`` process per
   session, for 100, 1,000 and 10,000 sessions, in one tunnel and spread
   over 1,000 tunnels.  ``ip l2tp`` is run up to 1,000 sessions only: at
   10,000 it alone would take longer than the whole benchmark budget under
   TCG (the per-process cost is flat, so 1,000 gives its rate).  Across
   1,000 tunnels the library runs 100 and 1,000 (``--many-max``) for the
   same reason.
2. The scaling curve: the library's per-operation cost in blocks of 100
   operations as the tunnel fills to 10,000 sessions and empties again.
   The timed phases run with /sys/kernel/rcu_expedited=1 (see
   rcu_expedited() below: Linux 6.1 waits one RCU grace period per session
   delete, whoever deletes it); 1,000 sessions are measured again as the
   kernel ships beside them.  ``--rcu kernel`` times everything as shipped.
3. Resident memory of a `pipexctl serve` daemon (real OffloadServer and
   Discovery, null kernel backend) tracking 0, 1,000 and 10,000 offloaded
   sessions learned from synthetic xl2tpd log lines.

    python -m pipexctl.testing.vm -- .venv/bin/python bench/controlplane.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

if "PYTHONPATH" not in os.environ:  # an A/B runs an older tree through PYTHONPATH
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipexctl import netns  # noqa: E402
from pipexctl.kernel import netlink as nlmod  # noqa: E402
from pipexctl.kernel.netlink import L2tpNetlink  # noqa: E402
from pipexctl.model import Encap, Endpoint, PwType, SessionSpec, TunnelSpec  # noqa: E402
from pipexctl.testing.probe import memory_kib  # noqa: E402

NS = "pxbenchcp"
SPLIT_TUNNEL = 9999  # the L2TPv2 tunnel of the request and dump splits (tunnels() numbers from 1)


@contextlib.contextmanager
def bench_netns():
    """The L2TP modules loaded and a fresh namespace NS (loopback up) that this
    thread and its children work in; deleted afterwards."""
    subprocess.run(["modprobe", "-a", "l2tp_netlink", "l2tp_ppp"], capture_output=True)
    subprocess.run(["ip", "netns", "del", NS], capture_output=True)
    subprocess.run(["ip", "netns", "add", NS], check=True)
    try:
        subprocess.run(["ip", "-n", NS, "link", "set", "lo", "up"], check=True)
        with netns.enter(NS):
            yield
    finally:
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)


def tunnels(nl: L2tpNetlink, n: int) -> list[int]:
    ids = list(range(1, n + 1))
    for t in ids:
        nl.tunnel_create(TunnelSpec(tunnel_id=t, peer_tunnel_id=t, version=3, encap=Encap.udp,
                                    local=Endpoint.parse(f"127.0.0.1:{20000 + t}"),
                                    remote=Endpoint.parse(f"127.0.0.1:{40000 + t}")))
    return ids


def delete_tunnels(nl: L2tpNetlink, ids: list[int], timeout: float = 120) -> None:
    """Delete and wait until the kernel no longer lists them: Linux deletes a
    tunnel in a work item, after its sessions, so the same id can be taken
    again only then (creating it at once met EEXIST)."""
    for t in ids:
        nl.tunnel_delete(t)
    end = time.monotonic() + timeout
    while {t.tunnel_id for t in nl.tunnel_dump()} & set(ids):
        if time.monotonic() > end:
            raise RuntimeError(f"tunnels still listed {timeout:.0f} s after their delete")
        time.sleep(0.1)


def placement(n: int, tids: list[int]) -> list[tuple[int, int]]:
    return [(tids[i % len(tids)], i + 1) for i in range(n)]


def lib_run(nl: L2tpNetlink, where: list[tuple[int, int]], curve: bool = False, pw: PwType = PwType.ppp) -> dict:
    blocks: list[float] = []
    t0 = time.perf_counter()
    b = t0
    for k, (t, s) in enumerate(where, 1):
        nl.session_create(SessionSpec(tunnel_id=t, session_id=s, peer_session_id=s, version=3, pw_type=pw))
        if curve and k % 100 == 0:
            now = time.perf_counter()
            blocks.append((now - b) / 100)
            b = now
    t1 = time.perf_counter()
    b = t1
    for k, (t, s) in enumerate(where, 1):
        nl.session_delete(t, s)
        if curve and k % 100 == 0:
            now = time.perf_counter()
            blocks.append((now - b) / 100)
            b = now
    t2 = time.perf_counter()
    n = len(where)
    r = {"sessions": n, "create_s": t1 - t0, "delete_s": t2 - t1, "per_op_us": (t2 - t0) / (2 * n) * 1e6,
         "sessions_per_s": n / (t2 - t0)}
    if curve:
        r["curve_per_op_us"] = [x * 1e6 for x in blocks]
    return r


class Floor:
    """The kernel's own time for a request, as near as user space can time
    it: the request's bytes encoded beforehand, one send() on a plain
    generic-netlink socket, its answers read with recv() up to the ack or
    NLMSG_DONE, nothing decoded.  What the library spends beyond this on
    the same request is its overhead."""

    def __init__(self, family: int) -> None:
        self.family = family
        self.seq = 1 << 20  # apart from the library socket's (each socket has its own anyway)
        self.buf = bytearray(1 << 16)
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, nlmod.NETLINK_GENERIC)
        self.sock.bind((0, 0))
        self.sock.setsockopt(nlmod.SOL_NETLINK, nlmod.NETLINK_CAP_ACK, 1)

    def encode(self, msg, dump: bool = False) -> tuple[int, bytes]:
        self.seq += 1
        flags = nlmod.NLM_F_REQUEST | (nlmod.NLM_F_DUMP if dump else nlmod.NLM_F_ACK)
        if isinstance(msg, getattr(nlmod, "Request", ())):  # this tree
            return self.seq, msg.encode(self.family, flags, self.seq)
        h = msg["header"]  # a pyroute2 message (a tree before 2026-12-04, run for an A/B)
        h["type"], h["flags"], h["sequence_number"], h["pid"] = self.family, flags, self.seq, 0
        msg.encode()
        return self.seq, bytes(msg.data)

    def run(self, req: tuple[int, bytes]) -> int:
        """Send; read to the end; the errno of the answer (0: done)."""
        seq, data = req
        self.sock.send(data)
        while True:
            n = self.sock.recv_into(self.buf)
            off = 0
            while off + 16 <= n:
                length, typ, _, rseq, _ = nlmod.NLMSG_HDR.unpack_from(self.buf, off)
                if rseq == seq and typ in (nlmod.NLMSG_ERROR, nlmod.NLMSG_DONE):
                    return -nlmod.ERRNO.unpack_from(self.buf, off + 16)[0]
                off += (length + 3) & ~3

    def close(self) -> None:
        self.sock.close()


def _ms(xs: list[float]) -> dict:
    return {"median_us": round(statistics.median(xs) * 1e6, 1), "mean_us": round(statistics.mean(xs) * 1e6, 1)}


def request_split(nl: L2tpNetlink, tid: int, n: int) -> dict:
    """Each request the offload makes per session (L2TPv2 PPP, in the
    L2TPv2 tunnel ``tid``), through the library and
    as the floor (``Floor``), interleaved one by one on the same tunnel so
    that both see the same table sizes and the same machine: session i
    through the library, session i + n as its floor.  A library delete
    waits until the kernel no longer lists the session (one more GET, that
    answers ENOENT); its floor is the DELETE plus that one GET."""
    fl = Floor(nl.family)
    lib: dict[str, list[float]] = {"create": [], "get": [], "delete": []}
    flo: dict[str, list[float]] = {"create": [], "get": [], "delete": [], "delete_request_only": []}
    pc = time.perf_counter

    def spec(s: int) -> SessionSpec:
        return SessionSpec(tunnel_id=tid, session_id=s, peer_session_id=s, version=2, pw_type=PwType.ppp)

    try:
        for s in range(1, n + 1):
            sp = spec(s)  # the caller's, as the offload builds it: not the library's time
            t = pc()
            nl.session_create(sp)
            lib["create"].append(pc() - t)
            req = fl.encode(nlmod.build_session_create(spec(s + n)))
            t = pc()
            rc = fl.run(req)
            flo["create"].append(pc() - t)
            assert rc == 0, rc
        for s in range(1, n + 1):
            t = pc()
            nl.session_get(tid, s)
            lib["get"].append(pc() - t)
            req = fl.encode(nlmod.build_session_get(tid, s + n))
            t = pc()
            fl.run(req)
            flo["get"].append(pc() - t)
        for s in range(1, n + 1):
            t = pc()
            nl.session_delete(tid, s)
            lib["delete"].append(pc() - t)
            d, g = fl.encode(nlmod.build_session_delete(tid, s + n)), fl.encode(nlmod.build_session_get(tid, s + n))
            t = pc()
            rc = fl.run(d)
            t1 = pc()
            fl.run(g)
            t2 = pc()
            flo["delete"].append(t2 - t)
            flo["delete_request_only"].append(t1 - t)
            assert rc == 0, rc
    finally:
        fl.close()
    out: dict = {"sessions": n}
    for op in lib:
        a, b = _ms(lib[op]), _ms(flo[op])
        out[op] = {"library": a, "floor": b, "overhead_us": round(a["median_us"] - b["median_us"], 1),
                   "overhead_per_kernel": round((a["median_us"] - b["median_us"]) / b["median_us"], 2)}
    out["delete"]["floor_request_only"] = _ms(flo["delete_request_only"])
    return out


def dump_split(nl: L2tpNetlink, tid: int, n: int, runs: int = 3) -> dict:
    """A dump of n sessions (L2TPv2 PPP, in tunnel ``tid``): decoded into models (``session_dump``), ids
    only (``session_ids``: discovery's scan), ids and counters
    (``session_counters``: a metrics snapshot), and the floor (every answer
    read, nothing decoded); interleaved, ``runs`` times each."""
    for s in range(1, n + 1):
        nl.session_create(SessionSpec(tunnel_id=tid, session_id=s, peer_session_id=s, version=2, pw_type=PwType.ppp))
    fl = Floor(nl.family)
    times: dict[str, list[float]] = {"models": [], "ids": [], "counters": [], "floor": []}
    try:
        for _ in range(runs):
            for name, f in (("models", nl.session_dump), ("ids", nl.session_ids),
                            ("counters", getattr(nl, "session_counters", None)),
                            ("floor", lambda: fl.run(fl.encode(nlmod.build_session_get(), dump=True)))):
                if f is None:  # an older tree
                    continue
                t = time.perf_counter()
                got = f()
                times[name].append(time.perf_counter() - t)
                assert name == "floor" or len(got) == n, (name, len(got))
    finally:
        fl.close()
        for s in range(1, n + 1):
            nl.session_delete(tid, s)
    return {"sessions": n, **{k: {"median_s": round(statistics.median(v), 3), "runs_s": [round(x, 3) for x in v]}
                              for k, v in times.items() if v}}


RCU_EXPEDITED = "/sys/kernel/rcu_expedited"


@contextlib.contextmanager
def rcu_expedited(value: str):
    """Set /sys/kernel/rcu_expedited for the block (restored afterwards);
    yields what was read before, or an error string when it cannot be set.

    Why the bench sets it: Linux 6.1's l2tp_session_unhash() calls
    synchronize_rcu() for every session deleted (removed upstream in 2024),
    under the genetlink mutex (the l2tp family is not parallel_ops), so each
    delete waits one normal grace period, ~19 ms under TCG, whoever asks:
    the library and `ip l2tp` alike.  Expedited grace periods keep that wait
    out of the timed phases (11,100 deletes at one size alone would be 3.5
    min of waiting); the as-shipped figure is measured beside them."""
    try:
        old = Path(RCU_EXPEDITED).read_text().strip()
        Path(RCU_EXPEDITED).write_text(value)
    except OSError as e:
        yield f"error: {RCU_EXPEDITED}: {e.strerror}"
        return
    try:
        yield old
    finally:
        Path(RCU_EXPEDITED).write_text(old)


def ip_run(where: list[tuple[int, int]]) -> dict:
    """One `ip l2tp` process per operation, started by one shell loop (as an
    operator's script would; cheaper per process than Python's subprocess)."""
    def loop(cmd: str) -> float:
        script = f"set -e\nwhile read -r t s; do {cmd}; done\n"
        lines = "".join(f"{t} {s}\n" for t, s in where)
        t0 = time.perf_counter()
        r = subprocess.run(["sh", "-c", script], input=lines, capture_output=True, text=True)
        dt = time.perf_counter() - t0
        if r.returncode:
            raise RuntimeError(f"ip l2tp loop ({cmd}): {r.stderr.strip()[-300:]}")
        return dt

    n = len(where)
    c = loop('ip l2tp add session tunnel_id "$t" session_id "$s" peer_session_id "$s"')
    d = loop('ip l2tp del session tunnel_id "$t" session_id "$s"')
    return {"sessions": n, "create_s": c, "delete_s": d, "per_op_us": (c + d) / (2 * n) * 1e6,
            "sessions_per_s": n / (c + d)}


def rss_child(n: int) -> int:
    """Run in a fresh process: a serve daemon's objects with n offloaded calls; prints VmRSS (KiB)."""
    import importlib
    import tempfile

    # the modules a `pipexctl serve` process has loaded (not prometheus_client:
    # --metrics is optional), so that the RSS is the daemon's
    for m in ("pipexctl.cli", "pipexctl.offload.datapath", "pipexctl.kernel.netlink"):
        importlib.import_module(m)
    from pipexctl.discovery.discovery import Discovery
    from pipexctl.kernel.backend import NullBackend
    from pipexctl.offload.datapath import KernelDataPath
    from pipexctl.offload.server import OffloadServer
    from pipexctl.offload.service import TunnelState
    from pipexctl.offload.statefile import SessionRecord

    d = tempfile.mkdtemp()
    log = Path(d, "xl2tpd.log")
    lines = ["xl2tpd[100]: xl2tpd version xl2tpd-1.3.18 started on lns PID:100"]
    per = 10  # calls per tunnel
    for t in range((n + per - 1) // per):
        tid = t + 1
        peer = f"10.{(t >> 16) & 255}.{(t >> 8) & 255}.{t & 255}"
        lines.append(f"xl2tpd[100]: Connection established to {peer}, 1701.  Local: {tid}, Remote: {tid + 1} "
                     f"(ref=0/0).  LNS session is 'default'")
        for c in range(min(per, n - t * per)):
            cid = t * per + c + 1
            lines.append(f"xl2tpd[100]: Call established with {peer}, PID: {100000 + cid}, Local: {cid}, "
                         f"Remote: {cid}, Serial: {cid}")
    log.write_text("\n".join(lines) + "\n")
    del lines  # the bench's, not the daemon's
    disc = Discovery([str(log)], proc=False, kernel=False)
    disc.refresh(control=False, events=False)  # as `pipexctl serve` starts
    # the real data path (its relay thread and sockets), with no tunnel socket: what is measured is the
    # daemon's own bookkeeping of n calls
    srv = OffloadServer(os.path.join(d, "s.sock"), disc, NullBackend(), KernelDataPath(),
                        state_path=os.path.join(d, "st"))
    svc = srv.service
    for c in disc.tracker.calls():
        key = (c.instance, c.tunnel_id)
        ts = svc.tunnels.get(key)
        if ts is None:
            ts = svc.tunnels[key] = TunnelState(c.instance, c.tunnel_id, c.peer_tunnel_id, "10.99.0.1", c.peer,
                                                1701, None, 1701)
        ts.records[c.call_id] = SessionRecord(call_id=c.call_id, peer_call_id=c.peer_call_id, pppd_pid=c.pppd_pid)
    tracked = sum(len(t.records) for t in svc.tunnels.values())
    assert tracked == n, (tracked, n)
    svc.save()
    print(json.dumps({"sessions": n, "rss_kib": memory_kib()["VmRSS"], "tracked": tracked}))
    disc.close()
    shutil.rmtree(d, ignore_errors=True)
    return 0


def profile_lib(n: int, rcu: str) -> int:
    """Where a library create + delete spends its time: Python (message
    building, parsing) or waiting in recv() for the kernel's answer."""
    import cProfile
    import io
    import pstats

    with bench_netns(), rcu_expedited("1" if rcu == "expedited" else "0"):
        nl = L2tpNetlink()
        one = tunnels(nl, 1)
        prof = cProfile.Profile()
        prof.enable()
        r = lib_run(nl, placement(n, one))
        prof.disable()
        nl.tunnel_delete(one[0])
        nl.close()
    out = io.StringIO()
    st = pstats.Stats(prof, stream=out)
    st.sort_stats("tottime").print_stats(15)
    total = sum(v[2] for v in st.stats.values())  # own time of every function
    # built-ins (file "~") that hand over to the kernel or wait for it: the
    # socket calls and the event loop's poll (pyroute2 0.9 runs an asyncio core)
    waits = sum(v[2] for k, v in st.stats.items()
                if k[0] == "~" and any(w in k[2] for w in ("recv", "send", "poll", "select")))
    print(f"{n} PPP sessions created + deleted, rcu {rcu}: {r['per_op_us']:.0f} us/op under cProfile; "
          f"own time in socket send/recv (the kernel's share, incl. its waits) {waits:.2f} s of {total:.2f} s "
          f"({100 * waits / total:.0f} %)")
    print(out.getvalue())
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="100,1000,10000")
    p.add_argument("--ip-max", type=int, default=1000)
    p.add_argument("--many-max", type=int, default=1000,
                   help="largest size run across 1,000 tunnels (10,000 there takes 5 min under TCG)")
    p.add_argument("--rcu", choices=("expedited", "kernel"), default="expedited",
                   help="grace periods during the timed phases: expedited (default; the as-shipped setting is "
                        "measured at 1,000 sessions beside them) or as the kernel ships them for every phase")
    p.add_argument("--out", default=os.path.join(os.environ.get("PIPEXCTL_RESULTS", "."), "controlplane.json"))
    p.add_argument("--rss-child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--split-only", action="store_true",
                   help="only the request split (--split-sessions) and the dump split (--dump-sessions)")
    p.add_argument("--split-sessions", type=int, default=1000)
    p.add_argument("--dump-sessions", type=int, default=10000)
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="only: cProfile of the library creating and deleting N PPP sessions in one tunnel "
                        "(grace periods as --rcu says), the top functions by own time to stdout")
    a = p.parse_args()
    if a.rss_child is not None:
        return rss_child(a.rss_child)
    if a.profile:
        return profile_lib(a.profile, a.rcu)
    sizes = [int(x) for x in a.sizes.split(",")]
    res: dict = {"kernel": os.uname().release, "cpus": os.cpu_count(), "eth_vs_ip": [], "one_tunnel": [],
                 "many_tunnels": [], "phase_seconds": {}}
    clock = [time.monotonic()]

    def phase(name: str) -> None:
        now = time.monotonic()
        res["phase_seconds"][name] = round(now - clock[0], 1)
        clock[0] = now

    with bench_netns(), rcu_expedited("1" if a.rcu == "expedited" else "0") as before:
        clock[0] = time.monotonic()  # the phases start after the set-up
        res["rcu_expedited"] = a.rcu == "expedited" and not before.startswith("error")
        res["rcu_expedited_before"] = before
        nl = L2tpNetlink()
        one = tunnels(nl, 1)
        v2 = SPLIT_TUNNEL
        nl.tunnel_create(TunnelSpec(tunnel_id=v2, peer_tunnel_id=v2, version=2, encap=Encap.udp,
                                    local=Endpoint.parse("127.0.0.1:19999"), remote=Endpoint.parse("127.0.0.1:39999")))
        res["request_split"] = request_split(nl, v2, a.split_sessions)
        print("request split", json.dumps(res["request_split"]), flush=True)
        if a.dump_sessions:
            res["dump_split"] = dump_split(nl, v2, a.dump_sessions)
            print("dump split", json.dumps(res["dump_split"]), flush=True)
        delete_tunnels(nl, [v2])
        phase("split")
        if a.split_only:
            delete_tunnels(nl, one)
            nl.close()
            Path(a.out).write_text(json.dumps(res, indent=1))
            return 0
        for n in [x for x in sizes if x <= a.ip_max]:
            r = {"lib": lib_run(nl, placement(n, one), pw=PwType.eth), "ip": ip_run(placement(n, one))}
            r["speedup"] = r["ip"]["per_op_us"] / r["lib"]["per_op_us"]
            res["eth_vs_ip"].append(r)
            print("eth, one tunnel", n, {k: round(v["per_op_us"], 1) for k, v in r.items() if isinstance(v, dict)},
                  flush=True)
        phase("eth_vs_ip")
        for n in sizes:
            r = {"lib": lib_run(nl, placement(n, one), curve=(n == max(sizes)))}
            res["one_tunnel"].append(r)
            print("ppp, one tunnel", n, round(r["lib"]["per_op_us"], 1), flush=True)
        phase("one_tunnel")
        if res["rcu_expedited"]:
            # the same 1,000 PPP sessions with the grace periods as the kernel ships them
            with rcu_expedited(before):
                res["as_shipped"] = {"rcu_expedited": before, "lib": lib_run(nl, placement(1000, one))}
            print("ppp, one tunnel, 1000, as shipped", round(res["as_shipped"]["lib"]["per_op_us"], 1), flush=True)
            phase("as_shipped")
        delete_tunnels(nl, one)
        many = tunnels(nl, 1000)
        for n in [x for x in sizes if x <= a.many_max]:
            r = {"lib": lib_run(nl, placement(n, many))}
            res["many_tunnels"].append(r)
            print("ppp, 1000 tunnels", n, round(r["lib"]["per_op_us"], 1), flush=True)
        delete_tunnels(nl, many)
        nl.close()
        phase("many_tunnels")
    res["serve_rss"] = []
    # one fresh process per size, all at once (nothing here is timed)
    kids = {n: subprocess.Popen([sys.executable, __file__, "--rss-child", str(n)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for n in (0, 1000, 10000)}
    for n, kid in kids.items():
        out, err = kid.communicate()
        if kid.returncode:
            res["serve_rss"].append({"sessions": n, "error": err.strip()[-400:]})
        else:
            res["serve_rss"].append(json.loads(out.strip().splitlines()[-1]))
        print("serve rss", res["serve_rss"][-1], flush=True)
    phase("serve_rss")
    Path(a.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
