"""Kernel support probe (`pipexctl check`): what this machine can offload."""

from __future__ import annotations

import os
import platform
import shutil
import socket
from dataclasses import asdict, dataclass

from .. import errors
from . import uapi


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    required: bool = True


def _module_loaded(name: str) -> bool:
    return os.path.isdir(f"/sys/module/{name}")


def _module_available(name: str) -> bool:
    rel = platform.release()
    base = f"/lib/modules/{rel}"
    try:
        with open(f"{base}/modules.dep") as f:
            stem = f"/{name}.ko"
            return any(stem in line.split(":")[0] for line in f)
    except OSError:
        return False


def _modules() -> list[Check]:
    out = []
    for name, required, why in (
        ("l2tp_core", True, "L2TP data path"),
        ("l2tp_netlink", True, "generic-netlink family 'l2tp'"),
        ("l2tp_ppp", True, "PPPoL2TP sockets (PPP over L2TP)"),
        ("l2tp_eth", False, "L2TPv3 Ethernet pseudowires"),
        ("l2tp_ip", False, "L2TPv3 over IP (encap ip)"),
        ("ppp_generic", True, "/dev/ppp and pppN interfaces"),
    ):
        if _module_loaded(name):
            out.append(Check(f"module {name}", True, f"loaded ({why})", required))
        elif _module_available(name):
            out.append(Check(f"module {name}", True, f"available, not loaded: modprobe {name} ({why})", required))
        else:
            out.append(Check(f"module {name}", False, f"missing from kernel {platform.release()} ({why})", required))
    return out


def sessions_per_namespace(release: str | None = None) -> bool:
    """Linux 6.11+ looks an L2TPv2 data packet's session up in the namespace,
    by tunnel and session id, whatever tunnel socket received it (6.1 looks
    only in the receiving socket's tunnel).  A version test: the lookup
    cannot be probed without building two tunnels and sending through them."""
    rel = release or platform.release()
    try:
        major, minor = (int(x) for x in rel.split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (6, 11)


def _twins() -> Check:
    if sessions_per_namespace():
        return Check("second tunnel from one peer address and port", True,
                     "on xl2tpd's port like the first (Linux 6.11+ finds sessions by id in the namespace)", False)
    return Check("second tunnel from one peer address and port", bool(shutil.which("nft")),
                 "on a private port, steered by nftables (Linux before 6.11); refused while IPsec policies "
                 "are configured", False)


def _genl() -> Check:
    try:
        from .netlink import L2tpNetlink  # pyroute2: only `pipexctl check` asks for the family

        with L2tpNetlink():
            pass
        return Check("genl family l2tp", True, "resolved")
    except errors.PipexError as e:
        return Check("genl family l2tp", False, str(e))
    except OSError as e:
        return Check("genl family l2tp", False, f"netlink error: {e}")


def _pppox() -> Check:
    try:
        s = socket.socket(uapi.AF_PPPOX, socket.SOCK_DGRAM, uapi.PX_PROTO_OL2TP)
        s.close()
        return Check("PPPoL2TP socket", True, "AF_PPPOX/PX_PROTO_OL2TP socket opened")
    except OSError as e:
        return Check("PPPoL2TP socket", False, f"{e.strerror}: modprobe l2tp_ppp")


def run_checks() -> list[Check]:
    checks = _modules()
    checks.append(_genl())
    checks.append(_pppox())
    checks.append(
        Check("/dev/ppp", os.path.exists("/dev/ppp"), "present" if os.path.exists("/dev/ppp") else "missing: modprobe ppp_generic")
    )
    nft = shutil.which("nft")
    checks.append(Check("nftables", bool(nft), nft or "nft not found: apt-get install nftables", required=False))
    checks.append(_twins())
    checks.append(
        Check("root", os.geteuid() == 0, "running as root" if os.geteuid() == 0 else "not root: creating objects needs CAP_NET_ADMIN", required=False)
    )
    return checks


def as_dicts(checks: list[Check]) -> list[dict[str, object]]:
    return [asdict(c) for c in checks]
