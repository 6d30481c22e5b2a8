"""ansible-test's validate-modules on the pipexctl.l2tp collection, with no
download but from the package index.

ansible-test runs each sanity test in a venv of its own and bootstraps pip
there with a script it downloads from Ansible's CI file server; here the
script it would cache is a stand-in that installs pip from Python's own
bundled wheel (ensurepip).  The test's requirements (voluptuous,
antsibull-docs-parser...) then come from the package index, as every other
dependency of the project does.  HOME is a temporary directory, so nothing
is cached in the user's."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COLLECTION = ROOT / "ansible" / "collections" / "ansible_collections" / "pipexctl" / "l2tp"
STAND_IN = """# ansible-test's pip bootstrap, offline: pip from Python's bundled wheel
import ensurepip, sys
sys.argv = sys.argv[:1]
ensurepip.bootstrap(upgrade=True)
"""


def _pip_version() -> str:
    import ansible_test

    text = (Path(ansible_test.__file__).parent / "_internal" / "python_requirements.py").read_text()
    return re.search(r"pip='(\d+(?:\.\d+)+)'", text)[1]


def test_validate_modules_passes(tmp_path):
    home = tmp_path / "home"
    cache = home / ".ansible" / "test" / "cache"
    cache.mkdir(parents=True)
    (cache / f"get_pip_{_pip_version().replace('.', '_')}.py").write_text(STAND_IN)
    work = tmp_path / "ansible_collections" / "pipexctl" / "l2tp"
    shutil.copytree(COLLECTION, work, ignore=shutil.ignore_patterns("__pycache__", "*.tar.gz"))
    env = {**os.environ, "HOME": str(home)}
    for cmd in (["git", "init", "-q", "."], ["git", "add", "-A"],
                ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "collection"]):
        subprocess.run(cmd, cwd=work, check=True, env=env)
    test = Path(sys.executable).with_name("ansible-test")
    r = subprocess.run([str(test), "sanity", "--test", "validate-modules", "--python",
                        f"{sys.version_info.major}.{sys.version_info.minor}", "--local", "--color", "no"],
                       cwd=work, capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert 'Running sanity test "validate-modules"' in r.stdout + r.stderr
