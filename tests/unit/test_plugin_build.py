"""The pppd plugin builds from one source for both pppd APIs Debian ships:
2.4.9 (Debian 12, this machine's ppp-dev) and 2.5.2 (Debian 13: trixie's
ppp-dev and pppd, unpacked under .cache/trixie-ppp by `make setup`).  Each
build uses -Wall -Wextra -Werror, and every symbol the plugin takes from its
host must be one that pppd binary exports (or libc): a plugin that names a
symbol pppd lacks fails to load (pppd: "undefined symbol") and the call
stays on its pty.  This checks the build and the link, not a run: pppd 2.5
has not run the plugin here (the Debian 13 guest is still to come)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "plugins" / "pipexctl.c"
TRIXIE = ROOT / ".cache" / "trixie-ppp"
FLAGS = ["-O2", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter", "-Wno-missing-field-initializers",
         "-fPIC", "-shared"]
WEAK = {"_ITM_deregisterTMCloneTable", "_ITM_registerTMCloneTable", "__cxa_finalize", "__gmon_start__"}


def dynamic_symbols(path: Path, defined: bool) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only" if defined else "--undefined-only", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def libc() -> Path:
    out = subprocess.run(["gcc", "-print-file-name=libc.so.6"], capture_output=True, text=True, check=True).stdout
    return Path(out.strip()).resolve()


def build(tmp_path: Path, name: str, *extra: str) -> Path:
    so = tmp_path / name
    r = subprocess.run(["gcc", *FLAGS, *extra, "-o", str(so), str(SRC)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return so


def missing_from(so: Path, pppd: Path) -> set[str]:
    return dynamic_symbols(so, False) - dynamic_symbols(pppd, True) - dynamic_symbols(libc(), True) - WEAK


@pytest.mark.parametrize("api", ["2.4.9", "2.5.2"])
def test_the_plugin_builds_and_links_against_each_pppd_api(tmp_path, api):
    if api == "2.4.9":
        so = build(tmp_path, "pipexctl-249.so")
        pppd = Path("/usr/sbin/pppd")
        version = subprocess.run(["pppd", "--version"], capture_output=True, text=True).stdout.split()[2]
    else:
        inc = TRIXIE / "dev" / "usr" / "include"
        assert (inc / "pppd" / "pppd.h").exists(), \
            f"{inc}/pppd is missing: `make setup` fetches trixie's ppp-dev (scripts/fetch_trixie_ppp.sh)"
        so = build(tmp_path, "pipexctl-252.so", "-DPPP_API_25", f"-I{inc}")
        pppd = TRIXIE / "ppp" / "usr" / "sbin" / "pppd"
        version = (inc / "pppd" / "pppdconf.h").read_text().split('PPPD_VERSION "')[1].split('"')[0]
    assert version == api
    assert missing_from(so, pppd) == set()
    # pppd refuses a plugin whose pppd_version is not its own: the string is built in
    assert api.encode() + b"\0" in so.read_bytes()


def test_the_link_check_catches_a_symbol_pppd_lacks(tmp_path):
    """The check above can fail: the 2.4.9 build names generic_establish_ppp,
    which pppd 2.5 renamed."""
    so = build(tmp_path, "pipexctl-249.so")
    assert "generic_establish_ppp" in missing_from(so, TRIXIE / "ppp" / "usr" / "sbin" / "pppd")
