"""The nftables steering transaction: shape, and accepted by nft's own parser."""

from __future__ import annotations

import json
import shutil
import subprocess

from pipexctl.offload.steering import Steer, delete_table, ruleset

A = Steer("10.99.1.1", "10.99.1.2", 1701, 40000, 0x1234, 0x5678)
B = Steer("10.99.1.1", "10.99.1.2", 1701, 40000, 0x1234, 0x9999)
C = Steer("10.99.1.1", "10.99.2.2", 1701, 40001, 0x4321, 0x0001)


def rules(doc):
    return [c["add"]["rule"] for c in doc["nftables"] if "add" in c and "rule" in c["add"]]


def test_empty_ruleset_is_a_flushed_table_with_two_raw_chains():
    doc = ruleset([])
    kinds = [next(iter(c)) for c in doc["nftables"][1:]]
    assert kinds == ["add", "flush", "add", "add"]
    chains = [c["add"]["chain"] for c in doc["nftables"] if "add" in c and "chain" in c["add"]]
    assert [(c["hook"], c["prio"]) for c in chains] == [("prerouting", -300), ("output", -300)]
    assert rules(doc) == []


def _matches(rule):
    out = {}
    for e in rule["expr"]:
        if "match" in e:
            left = e["match"]["left"]["payload"]
            key = left.get("field") and f"{left['protocol']}.{left['field']}" or f"th@{left['offset']}/{left['len']}"
            out[key] = e["match"]["right"]
    return out


def test_per_session_rules_both_l_bit_offsets_and_one_output_rule_per_tunnel():
    rs = rules(ruleset([A, B, C]))
    pre = [r for r in rs if r["chain"] == "pre"]
    out = [r for r in rs if r["chain"] == "out"]
    assert len(pre) == 6 and len(out) == 2
    m = [_matches(r) for r in pre if r["comment"].startswith("t4660 s22136")]
    assert len(m) == 2
    no_l = next(x for x in m if x["th@65/1"] == 0)
    with_l = next(x for x in m if x["th@65/1"] == 1)
    assert no_l["th@64/1"] == 0 and with_l["th@64/1"] == 0  # data only: T bit clear
    assert (no_l["th@80/16"], no_l["th@96/16"]) == (0x1234, 0x5678)
    assert (with_l["th@96/16"], with_l["th@112/16"]) == (0x1234, 0x5678)
    assert no_l["ip.saddr"] == "10.99.1.2" and no_l["udp.sport"] == 1701 and no_l["udp.dport"] == 1701
    mangles = [e["mangle"] for e in pre[0]["expr"] if "mangle" in e]
    assert [(x["key"]["payload"]["field"], x["value"]) for x in mangles] == [("dport", 40000), ("checksum", 0)]
    assert any("notrack" in e for e in pre[0]["expr"])
    o = _matches(out[0])
    assert (o["ip.saddr"], o["udp.sport"], o["udp.dport"]) == ("10.99.1.1", 40000, 1701)
    assert [e["mangle"]["value"] for e in out[0]["expr"] if "mangle" in e] == [1701, 0]


def test_nft_accepts_the_transactions():
    nft = shutil.which("nft")
    assert nft, "nft is needed (make setup installs nftables)"
    for doc in (ruleset([A, B, C]), ruleset([]), delete_table()):
        r = subprocess.run([nft, "-c", "-j", "-f", "-"], input=json.dumps(doc), capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def test_libnftables_binding_checks_like_the_nft_program():
    """The in-process path (ctypes libnftables, dry run) accepts what nft
    accepts and rejects a broken transaction with nft's own message."""
    from pipexctl import errors
    from pipexctl.offload.steering import Nft

    nft = Nft(dry_run=True)
    assert nft._lib is not None, "libnftables.so.1 not loadable"
    for doc in (ruleset([A, B, C]), ruleset([]), delete_table()):
        nft.apply(doc)
    bad = ruleset([A])
    bad["nftables"][-1]["add"]["rule"]["chain"] = "no-such-chain"
    try:
        nft.apply(bad)
    except errors.KernelError as e:
        assert "no-such-chain" in str(e) or "No such file" in str(e), e
    else:
        raise AssertionError("a rule in a missing chain was accepted")


def test_update_deletes_by_handle_and_adds_only_what_differs():
    from pipexctl.offload.steering import rules, update

    have = rules([A, B])
    handles = {k: 10 + i for i, k in enumerate(have)}
    want = rules([B, C])
    doc, new = update(handles, want)
    cmds = doc["nftables"][1:]
    deleted = sorted(c["delete"]["rule"]["handle"] for c in cmds if "delete" in c)
    assert deleted == sorted(handles[k] for k in have if k not in want)
    assert [c["add"]["rule"] for c in cmds if "add" in c] == [want[k]["add"]["rule"] for k in new]
    assert set(new) == set(want) - set(have)
    assert update(handles, have)[0]["nftables"][1:] == []


class EchoNft:
    """Hands out handles like nft and refuses a handle it does not hold."""

    def __init__(self):
        self.rules, self.next, self.docs = {}, 1, []

    def apply(self, doc):
        raise AssertionError("Steering must use apply_echo when it exists")

    def apply_echo(self, doc):
        from pipexctl import errors

        self.docs.append(doc)
        added = []
        staged = dict(self.rules)
        for c in doc["nftables"][1:]:
            if "flush" in c:
                staged = {}
            elif "delete" in c:
                if c["delete"]["rule"]["handle"] not in staged:
                    raise errors.KernelError("No such file or directory")
                del staged[c["delete"]["rule"]["handle"]]
            elif "rule" in c.get("add", {}):
                staged[self.next] = c["add"]["rule"]
                added.append(self.next)
                self.next += 1
        self.rules = staged  # one transaction: all or nothing
        return added


def test_steering_updates_incrementally_and_rewrites_after_a_failure():
    from pipexctl.offload.steering import Steering, rules

    nft = EchoNft()
    st = Steering(nft)
    st.apply([A])
    st.apply([A, B])
    st.apply([B])
    assert (st.rewrites, st.updates) == (1, 2)
    assert sorted(r["comment"] for r in nft.rules.values()) == sorted(r["add"]["rule"]["comment"]
                                                                    for r in rules([B]).values())
    nft.rules.clear()  # flushed behind our back: the next delete misses its handle
    st.apply([C])
    assert st.rewrites == 2 and len(nft.rules) == len(rules([C]))
    assert "flush" in json.dumps(nft.docs[-1])
