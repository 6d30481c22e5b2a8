"""Incremental steering against the kernel's nftables, in namespaces made
here (pair.a, pair.b).  What is installed is read back with `nft -j list`,
not from pipexctl's own bookkeeping."""

from __future__ import annotations

import json
import subprocess

import pytest

from pipexctl.offload.steering import TABLE, Nft, Steer, Steering, ruleset

pytestmark = pytest.mark.kernel

A = Steer("10.0.0.1", "10.0.0.2", 1701, 40000, 10, 1)
B = Steer("10.0.0.1", "10.0.0.2", 1701, 40000, 10, 2)  # A's tunnel
C = Steer("10.0.0.1", "10.0.0.3", 1701, 40001, 11, 5)


def listed(ns: str) -> list[tuple]:
    """(chain, comment, expression without counter values) of every rule."""
    r = subprocess.run(["ip", "netns", "exec", ns, "nft", "-j", "list", "table", "ip", TABLE],
                       capture_output=True, text=True, check=True)
    out = []
    for i in json.loads(r.stdout)["nftables"]:
        if "rule" in i:
            rule = i["rule"]
            expr = [{"counter": None} if "counter" in e else e for e in rule["expr"]]
            out.append((rule["chain"], rule.get("comment"), json.dumps(expr, sort_keys=True)))
    return sorted(out)


def test_incremental_updates_equal_a_full_rewrite_and_survive_a_flush(pair):
    st = Steering(Nft(netns=pair.a))
    st.apply([A])
    assert (st.rewrites, st.updates, len(listed(pair.a))) == (1, 0, 3)
    st.apply([A, B])  # two session rules, the tunnel's out rule is there already
    st.apply([A, B, C])  # a new tunnel: its out rule too
    st.apply([B, C])  # A's rules go, the tunnel's out rule stays for B
    assert (st.rewrites, st.updates) == (1, 3)
    Nft(netns=pair.b).apply(ruleset([B, C]))
    assert listed(pair.a) == listed(pair.b) and len(listed(pair.a)) == 6  # 2 per session, 1 per tunnel
    st.apply([C, B])  # nothing differs: no transaction at all
    assert st.updates == 3
    # someone flushes the table: the next update misses its handles and rewrites
    subprocess.run(["ip", "netns", "exec", pair.a, "nft", "flush", "table", "ip", TABLE], check=True)
    st.apply([C])
    assert st.rewrites == 2 and listed(pair.a) == listed_after(pair.b, [C])


def listed_after(ns: str, steers) -> list[tuple]:
    Nft(netns=ns).apply(ruleset(steers))
    return listed(ns)
