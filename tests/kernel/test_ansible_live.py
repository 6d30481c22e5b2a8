"""The Ansible module and role, run for real with ansible-core in the guest
against localhost: changed, then unchanged, check mode, error cases.  The
kernel and the files are checked here independently (`ip l2tp show`, the
options files' text)."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .conftest import ip_l2tp

pytestmark = [pytest.mark.kernel, pytest.mark.debian12]  # the role builds the plugin with gcc and ppp-dev on bookworm

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def installed_collection() -> str:
    """pipexctl.l2tp built with ansible-galaxy and installed from its tarball
    (as an operator installs it), into a directory of its own."""
    out = Path(tempfile.mkdtemp(prefix="pipexctl-collection-"))
    bindir = Path(sys.executable).parent
    env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "ANSIBLE_LOCAL_TEMP": "/tmp/ansible-local"}
    src = ROOT / "ansible" / "collections" / "ansible_collections" / "pipexctl" / "l2tp"
    r = subprocess.run([str(bindir / "ansible-galaxy"), "collection", "build", "--output-path", str(out), str(src)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (tar,) = out.glob("pipexctl-l2tp-*.tar.gz")
    r = subprocess.run([str(bindir / "ansible-galaxy"), "collection", "install", "--offline", "-p", str(out / "installed"),
                        str(tar)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (out / "installed" / "ansible_collections" / "pipexctl" / "l2tp" / "MANIFEST.json").exists()
    return str(out / "installed")


def playbook(*args, cwd=ROOT / "ansible", check=True, timeout=600):
    env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_CONFIG": str(ROOT / "ansible" / "ansible.cfg"), "ANSIBLE_LOCAL_TEMP": "/tmp/ansible-local",
           # the collection as installed from its built tarball, not this checkout's source tree
           "ANSIBLE_COLLECTIONS_PATH": installed_collection(),
           "ANSIBLE_REMOTE_TEMP": "/tmp/ansible-remote",
           # each task's wall time at the end of the transcript (the guest keeps them)
           "ANSIBLE_CALLBACK_PLUGINS": str(Path(__file__).parent / "ansible" / "callback_plugins"),
           "ANSIBLE_CALLBACKS_ENABLED": "task_seconds"}
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", *args],
                       capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
    if check:
        assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    return r


def recap(out: str) -> dict:
    m = re.search(r"localhost\s*:\s*(.*)", out.split("PLAY RECAP")[-1])
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}


def keep(name: str, r) -> None:
    if os.environ.get("PIPEXCTL_RESULTS"):  # the transcripts, for the record
        Path(os.environ["PIPEXCTL_RESULTS"], name).write_text(r.stdout)


def test_both_modules_against_the_kernel_and_options_files(pair, tmp_path):
    """pipexctl_session against the kernel, and pipexctl_offload alone on two
    options files, in one ansible-playbook run (each run costs ~30 s of
    start-up under TCG)."""
    missing, kmode = tmp_path / "options.lac", tmp_path / "options.kernel"
    missing.write_text("noauth\n")
    kmode.write_text("plugin pppol2tp.so\n")
    here = Path(__file__).parent / "ansible"
    r = playbook(str(here / "session.yml"), str(here / "offload.yml"), "-e", f"ns={pair.a}",
                 "-e", f"venv_python={sys.executable}", "-e", f"missing={missing}", "-e", f"kernel_mode={kmode}",
                 "--diff")
    keep("ansible-modules.txt", r)
    assert recap(r.stdout)["failed"] == 0
    # the playbooks' own asserts passed; the kernel agrees: nothing is left
    assert ip_l2tp(pair.a, "session") == [] and ip_l2tp(pair.a, "tunnel") == []
    # check mode wrote nothing; the refused file is untouched
    assert missing.read_text() == "noauth\n" and kmode.read_text() == "plugin pppol2tp.so\n"


@pytest.mark.long('390 s under TCG: the role twice; test_both_modules runs the modules against the kernel')
def test_role_changed_then_unchanged(tmp_path):
    conf = tmp_path / "xl2tpd.conf"
    lns_opts, lac_opts = tmp_path / "options.lns", tmp_path / "options.lac"
    conf.write_text(f"[global]\nport = 1701\n\n[lns default]\nip range = 10.1.0.2-10.1.0.9\n"
                    f"pppoptfile = {lns_opts}\n\n[lac up]\nlns = 192.0.2.1\npppoptfile = {lac_opts}\n")
    lns_opts.write_text("noauth\nmtu 1400\n")
    lac_opts.write_text("noauth\n")
    (tmp_path / "systemd").mkdir()
    (tmp_path / "modules").mkdir()
    extra = ["-e", f"pipexctl_source={ROOT}", "-e", f"pipexctl_venv={Path(sys.executable).parent.parent}",
             "-e", f"pipexctl_xl2tpd_conf={conf}", "-e", f"pipexctl_systemd_dir={tmp_path / 'systemd'}",
             "-e", f"pipexctl_modules_load_dir={tmp_path / 'modules'}", "-e", "pipexctl_manage_service=false",
             "-e", "pipexctl_timeout=10",
             # the apt task: its package names are checked on the host
             # (tests/unit/test_ansible.py), apt itself is Ansible's; under TCG
             # it cost ~48 s per run
             "-e", "pipexctl_install_packages=false"]
    site = tmp_path / "site.yml"
    site.write_text("- hosts: localhost\n  connection: local\n  gather_facts: false\n  roles: [pipexctl.l2tp.lns]\n")
    first = playbook(str(site), *extra)
    got = recap(first.stdout)
    assert got["failed"] == 0 and got["changed"] >= 3, first.stdout[-3000:]
    for f in (lns_opts, lac_opts):
        text = f.read_text()
        assert "plugin pipexctl.so\npipexctl_socket /run/pipexctl/serve.sock\npipexctl_timeout 10\n" in text
        assert text.startswith("noauth\n")  # lines outside the block untouched
    unit = (tmp_path / "systemd" / "pipexctl.service").read_text()
    assert f"ExecStart={Path(sys.executable).parent}/pipexctl serve $PIPEXCTL_OPTS" in unit
    assert 'Environment="PIPEXCTL_OPTS=-v --socket /run/pipexctl/serve.sock ' in unit
    assert "ListenStream=/run/pipexctl/serve.sock" in (tmp_path / "systemd" / "pipexctl.socket").read_text()
    assert (tmp_path / "modules" / "pipexctl.conf").read_text() == (ROOT / "systemd" / "pipexctl-modules.conf").read_text()
    # second run: nothing to do
    second = playbook(str(site), *extra)
    keep("ansible-role-first.txt", first)
    keep("ansible-role-second.txt", second)
    assert recap(second.stdout)["changed"] == 0, second.stdout[-3000:]
