"""Missing kernel modules: a clear message and nothing half-made.

Runs last (file order): it unloads L2TP modules and blocks their automatic
loading through /proc/sys/kernel/modprobe, then restores both.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import pytest

from pipexctl import errors
from pipexctl.kernel.netlink import L2tpNetlink
from pipexctl.model import Endpoint, PwType, SessionSpec, TunnelSpec

from .conftest import ip_l2tp

pytestmark = pytest.mark.kernel

MODPROBE = "/proc/sys/kernel/modprobe"


@contextlib.contextmanager
def modules_unloaded(*mods: str):
    with open(MODPROBE) as f:
        old = f.read().strip()
    with open(MODPROBE, "w") as f:
        f.write("/bin/false\n")
    try:
        end = time.monotonic() + 15
        while True:
            # namespaces of earlier tests are torn down asynchronously
            r = subprocess.run(["modprobe", "-r", *mods], capture_output=True, text=True)
            left = [m for m in mods if os.path.isdir(f"/sys/module/{m}")]
            if not left:
                break
            if time.monotonic() > end:
                raise AssertionError(f"cannot unload {left}: {r.stderr}")
            time.sleep(0.2)
        yield
    finally:
        with open(MODPROBE, "w") as f:
            f.write(old + "\n")
        subprocess.run(["modprobe", "-a", *mods], check=True)


def test_missing_l2tp_eth_rolls_back_the_tunnel(pair, orch_in):
    o = orch_in(pair.a)  # netlink socket opened while l2tp_netlink is loaded
    t = TunnelSpec(tunnel_id=100, peer_tunnel_id=200, local=Endpoint.parse(f"{pair.A4}:5000"),
                   remote=Endpoint.parse(f"{pair.B4}:5001"))
    s = SessionSpec(tunnel_id=100, session_id=10, peer_session_id=20, pw_type=PwType.eth)
    with modules_unloaded("l2tp_eth"):
        with pytest.raises(errors.KernelSupportError, match="modprobe l2tp_eth"):
            o.add_session(s, t)
        assert ip_l2tp(pair.a, "tunnel") == []


def test_missing_genl_family_is_a_clear_error():
    with modules_unloaded("l2tp_eth", "l2tp_ppp", "l2tp_netlink"):
        with pytest.raises(errors.KernelSupportError, match=r"kernel L2TP support missing.*modprobe l2tp_netlink"):
            L2tpNetlink()
        r = subprocess.run([sys.executable, "-m", "pipexctl", "showtun"], capture_output=True, text=True)
        assert r.returncode == 1
        assert r.stderr.startswith("pipexctl: error: kernel L2TP support missing")
        assert len(r.stderr.strip().splitlines()) == 1
        r = subprocess.run([sys.executable, "-m", "pipexctl", "check"], capture_output=True, text=True)
        assert r.returncode == 1
        assert "FAIL  genl family l2tp" in r.stdout
