"""Transport-mode ESP between two namespaces, and a count of what crosses
the wire in cleartext (for tests and the bench; inside the guest).

Static keys, as ``ip xfrm`` sets them: no IKE daemon is needed to prove
what the kernel does with the packets.  Policies select UDP/1701 the way
strongSwan's ``leftprotoport=17/1701`` does (``shape="1701"``), or all
traffic of the host pair (``shape="hosts"``)."""

from __future__ import annotations

import json
import subprocess

KEY_ENC = "0x" + "11" * 16
KEY_AUTH = "0x" + "22" * 32


def _sh(*cmd: str) -> str:
    r = subprocess.run(list(cmd), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r.stdout


def esp(ns_a: str, a: str, ns_b: str, b: str, shape: str = "1701") -> None:
    """ESP in transport mode between address ``a`` (in ``ns_a``) and ``b``."""
    subprocess.run(["modprobe", "-a", "xfrm_user", "esp4"], capture_output=True)
    for ns, me, him in ((ns_a, a, b), (ns_b, b, a)):
        for src, dst, spi in ((a, b, "0x1001"), (b, a, "0x1002")):
            _sh("ip", "-n", ns, "xfrm", "state", "add", "src", src, "dst", dst, "proto", "esp", "spi", spi,
                "reqid", "1", "mode", "transport", "auth", "sha256", KEY_AUTH, "enc", "aes", KEY_ENC)
        sel_out = ["proto", "udp", "sport", "1701"] if shape == "1701" else []
        sel_in = ["proto", "udp", "dport", "1701"] if shape == "1701" else []
        _sh("ip", "-n", ns, "xfrm", "policy", "add", "src", me, "dst", him, *sel_out, "dir", "out",
            "tmpl", "src", me, "dst", him, "proto", "esp", "reqid", "1", "mode", "transport")
        _sh("ip", "-n", ns, "xfrm", "policy", "add", "src", him, "dst", me, *sel_in, "dir", "in",
            "tmpl", "src", him, "dst", me, "proto", "esp", "reqid", "1", "mode", "transport")


def wire_counter(ns: str, dev: str) -> None:
    """Count, on ``dev``'s ingress (the wire, before decryption), L2TP in
    cleartext and ESP packets (table ``netdev wire``)."""
    rules = (f"table netdev wire {{\n chain in {{\n type filter hook ingress device {dev} priority 0\n"
             f" udp sport 1701 counter\n udp dport 1701 counter\n ip protocol esp counter\n }}\n}}\n")
    r = subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nft in {ns}: {r.stderr.strip()}")


def wire_counts(ns: str) -> dict[str, int]:
    """{"cleartext": packets, "esp": packets} counted by wire_counter()."""
    doc = json.loads(_sh("ip", "netns", "exec", ns, "nft", "-j", "list", "table", "netdev", "wire"))["nftables"]
    counts = {"cleartext": 0, "esp": 0}
    for item in doc:
        rule = item.get("rule")
        if rule:
            what = "esp" if "esp" in json.dumps(rule["expr"]) else "cleartext"
            counts[what] += next(e["counter"]["packets"] for e in rule["expr"] if "counter" in e)
    return counts


def xfrm_stat(ns: str, name: str) -> int:
    """A counter of /proc/net/xfrm_stat (e.g. XfrmInTmplMismatch) in ``ns``."""
    text = _sh("ip", "netns", "exec", ns, "cat", "/proc/net/xfrm_stat")
    return next(int(line.split()[1]) for line in text.splitlines() if line.startswith(name))
