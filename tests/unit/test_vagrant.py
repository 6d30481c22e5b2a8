"""The Vagrant lab's files are valid (a `vagrant up` needs VirtualBox or
libvirt and a box download, which CI has not): Ruby syntax of the
Vagrantfile, sh syntax of the provisioning scripts, and the role and paths
it names exist."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
V = ROOT / "vagrant"


def test_vagrantfile_is_valid_ruby():
    r = subprocess.run(["ruby", "-c", str(V / "Vagrantfile")], capture_output=True, text=True)
    assert r.returncode == 0 and "Syntax OK" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("script", ["xl2tpd-lns.sh", "xl2tpd-lac.sh", "call.sh"])
def test_provisioning_scripts_parse(script):
    r = subprocess.run(["sh", "-n", str(V / script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_vagrantfile_names_what_exists():
    text = (V / "Vagrantfile").read_text()
    for path in re.findall(r'path: "([^"]+)"', text) + [re.search(r'inventory_path = "/vagrant/(\S+)"', text)[1]]:
        assert (V / path).exists() or (ROOT / path).exists(), path
    assert re.search(r'a.playbook = "site.yml"', text) and (ROOT / "ansible" / "site.yml").exists()
