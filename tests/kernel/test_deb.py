"""The Debian package (`make deb`, scripts/build_deb.sh), installed with
dpkg on the guest's root, offloads a call with its own binary, plugin and
units, and `dpkg --purge` leaves nothing behind.  `make test` builds the
package before the guest boots."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pipexctl.testing.lab import Lab

from .conftest import ip_l2tp, wait_until
from .test_offload import ping, ppp_up

pytestmark = [pytest.mark.kernel, pytest.mark.debian12]  # the bookworm .deb: Depends: ppp (= 2.4.9...)



def sh(*c, check=True):
    r = subprocess.run(list(c), capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, f"{c}: {r.stdout[-2000:]}{r.stderr[-2000:]}"
    return r.stdout + r.stderr


def test_the_deb_installs_offloads_a_call_with_its_own_files_and_purges_clean(packaged):
    deb, plugin = packaged
    lab = None
    try:
        sh("dpkg", "-i", str(deb))
        assert "Status: install ok installed" in sh("dpkg", "-s", "pipexctl")
        files = [f for f in sh("dpkg", "-L", "pipexctl").splitlines() if os.path.isfile(f)]
        assert str(plugin) in files and "/usr/bin/pipexctl" in files
        assert "/lib/systemd/system/pipexctl.socket" in files and "/usr/share/man/man8/pipexctl.8.gz" in files
        assert "ExecStart=/usr/bin/pipexctl serve" in Path("/lib/systemd/system/pipexctl.service").read_text()
        sh("/usr/bin/pipexctl", "check")
        # a call offloaded by the packaged daemon and plugin (loaded by name from pppd's plugin dir)
        lab = Lab(kernel_mode=False).setup(1)
        lab.start_all("plugin pipexctl.so\npipexctl_socket {sock}\npipexctl_required\n")
        inst, l1 = lab.lns, lab.lacs[0]
        out = open(inst.dir / "serve.log", "ab")
        lab.serves.append(subprocess.Popen(
            ["ip", "netns", "exec", inst.ns, "/usr/bin/pipexctl", "serve", "-v", "--socket", lab.serve_socket(inst),
             "--log", str(inst.log), "--control", inst.control], stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True))
        out.close()
        wait_until(lambda: os.path.exists(lab.serve_socket(inst)), "the packaged daemon up", timeout=90)
        lab.serve(l1)
        lab.connect(l1)
        wait_until(lambda: ppp_up(inst.ns) and len(ip_l2tp(inst.ns, "session")) == 1, "call offloaded",
                   detail=lab.tails)
        ok, text = ping(l1.ns, "10.99.100.1")
        assert ok, text
        assert "pipexctl: kernel channel for tunnel" in (inst.dir / "pppd.log").read_text()
        lab.disconnect(l1)
        wait_until(lambda: ip_l2tp(inst.ns, "session") == [], "call ended", timeout=60, detail=lab.tails)
        lab.teardown()
        lab = None
        sh("dpkg", "--purge", "pipexctl")
        left = [f for f in files if os.path.lexists(f)]
        assert left == [], left
        assert "is not installed" in sh("dpkg", "-s", "pipexctl", check=False)
        assert not os.path.exists("/run/pipexctl") and not os.path.exists("/usr/lib/pipexctl")
        assert "pipexctl" not in sh("nft", "list", "tables", check=False)
    finally:
        if lab is not None:
            lab.teardown()
        sh("dpkg", "--purge", "pipexctl", check=False)
