"""What `pipexctl serve`'s memory is made of, on the host (no kernel): the
RSS once serve's modules are imported, and what discovery's model of N
calls adds (read from a synthetic xl2tpd log, as a start reads it, with
the heap trimmed as serve trims it).  Each variant runs in a fresh
interpreter, the variants interleaved (``--rounds``), so the machine's
drift falls on all alike:

- ``as-is``: serve as it ships (its entry point keeps OpenSSL out,
  ``pipexctl/entry.py``);
- ``with-openssl``: OpenSSL's libcrypto loaded, as a program that imports
  the library without the entry point has it.

(The variants of pydantic's plugin loader and of its deferred model builds
went with pydantic, 2026-12-07; their figures are in docs/offload.md.  To
compare two commits, run this script in a worktree of each.)

``--fds N`` measures instead what one fd in an epoll set costs, N UDP
sockets registered in a ``selectors`` selector and in ``pipexctl.poller``
(tracemalloc, bytes per fd).  ``--maps N`` measures what a tunnel's map
of sessions costs when it holds one, as a dict and as ``SmallIndexed``.

Not a test: it asserts nothing.  bench/holdcalls.py measures the same
daemon holding real kernel calls in the guest.

    .venv/bin/python bench/servemem.py --calls 10000 --rounds 2
    .venv/bin/python bench/servemem.py --fds 5000
    .venv/bin/python bench/servemem.py --maps 10000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("as-is", "with-openssl")


def child(variant: str, calls: int, log: str) -> dict:
    """In a fresh interpreter: import what serve imports, then read the log."""
    from pipexctl import entry

    if variant == "as-is":
        entry.lean()
    import gc

    import pipexctl.offload.server  # noqa: F401  # what serve imports
    from pipexctl.discovery.discovery import Discovery
    from pipexctl.offload import malloc
    from pipexctl.offload.watch import CallWatch
    from pipexctl.testing.probe import memory_kib

    def mib() -> dict[str, float]:
        m = memory_kib()
        return {"rss": round(m["VmRSS"] / 1024, 2), "anon": round(m["RssAnon"] / 1024, 2),
                "file": round(m["RssFile"] / 1024, 2)}

    gc.collect()
    malloc.trim()
    out: dict = {"variant": variant, "imported": mib(), "libcrypto": _mapped("libcrypto"),
                 "importlib_metadata": "importlib.metadata" in sys.modules,
                 "pydantic": any(m.split(".")[0] == "pydantic" for m in sys.modules)}
    if calls:
        w = CallWatch(Discovery([log], proc=False, kernel=False))
        w.first_read()
        gc.collect()
        malloc.trim()
        out["model"] = mib()
        out["calls"] = len(w.discovery.tracker.calls())
        out["model_kib_per_call"] = round((out["model"]["anon"] - out["imported"]["anon"]) * 1024 / calls, 3)
    return out


def per_fd(n: int) -> dict:
    """Bytes per registered fd: a selector's key and map entry against the poller's dict entry."""
    import resource
    import selectors
    import socket
    import tracemalloc

    from pipexctl.poller import Poller

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, n + 100)), hard))
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(n)]
    out = {}
    try:
        for name, make in (("selectors", selectors.DefaultSelector), ("poller", Poller)):
            datas = [100000 + i for i in range(n)]  # the value each fd carries (a pid), made before the count
            tracemalloc.start()
            sel = make()
            for s, d in zip(socks, datas):
                if name == "selectors":
                    sel.register(s.fileno(), selectors.EVENT_READ, d)
                else:
                    sel.register(s.fileno(), d)
            out[name] = round(tracemalloc.get_traced_memory()[0] / n, 1)
            tracemalloc.stop()
            sel.close()
    finally:
        for s in socks:
            s.close()
    return {"fds": n, "bytes_per_fd": out}


def per_map(n: int) -> dict:
    """Bytes per tunnel's map of sessions holding one (most tunnels carry one
    call): a dict (``Indexed``, as the tunnels' ``Records`` were until
    2026-12-07's third change) against ``SmallIndexed``."""
    import tracemalloc

    from pipexctl.indexed import Indexed, SmallIndexed

    out = {}
    for cls in (Indexed, SmallIndexed):
        keys = [1000 + i for i in range(n)]  # the call ids and the records, made before the count
        recs = [object() for _ in range(n)]
        tracemalloc.start()
        maps = [cls() for _ in range(n)]
        for m, k, r in zip(maps, keys, recs):
            m[k] = r
        out[cls.__name__] = round(tracemalloc.get_traced_memory()[0] / n, 1)
        tracemalloc.stop()
        del maps
    return {"maps": n, "bytes_per_map_of_one": out}


def _mapped(name: str) -> bool:
    with open("/proc/self/maps") as f:
        return any(name in ln for ln in f)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=10000, help="calls in discovery's model (0: imports only)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", help="write the rows here as JSON")
    p.add_argument("--fds", type=int, default=0, help="measure an epoll set's cost per fd instead, with this many")
    p.add_argument("--maps", type=int, default=0,
                   help="measure a tunnel's map of sessions (one each) instead, with this many")
    p.add_argument("--child", nargs=3, metavar=("VARIANT", "CALLS", "LOG"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], int(a.child[1]), a.child[2])))
        return 0
    if a.fds:
        print(json.dumps(per_fd(a.fds)))
        return 0
    if a.maps:
        print(json.dumps(per_map(a.maps)))
        return 0
    sys.path.insert(0, str(ROOT / "bench"))
    from fresh import interleaved, write_rows
    from holdcalls import write_xl2tpd_log

    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "syslog")
        write_xl2tpd_log(Path(log), list(range(100000, 100000 + a.calls)))
        rows = interleaved(VARIANTS, a.rounds, lambda v: [__file__, "--child", v, str(a.calls), log])
    if a.out:
        write_rows(a.out, {"calls": a.calls}, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
