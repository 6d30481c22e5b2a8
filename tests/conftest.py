"""Test-session plumbing: kernel tests run in the Debian-kernel guest.

Tests marked ``kernel`` need the real L2TP/PPP kernel.  Where this host has
it (root, genl family "l2tp" resolvable) they run here.  Otherwise all of
them run inside ONE boot of the QEMU guest (pipexctl.testing.vm), and each
host-side test item reports its guest result: passed, or failed with the
guest's traceback.  A test skipped inside the guest counts as a failure
(kernel tests must not skip), and if the guest cannot boot every kernel test
fails with the reason.  Nothing is mocked.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUEST_REPORT = os.environ.get("PIPEXCTL_GUEST_REPORT")


def _host_kernel_reason() -> str | None:
    """None when this host can run kernel tests itself, else why not."""
    if os.environ.get("PIPEXCTL_IN_GUEST") == "1":
        return None
    if os.geteuid() != 0:
        return "not running as root"
    try:
        from pipexctl.kernel.netlink import L2tpNetlink

        with L2tpNetlink():
            pass
    except Exception as e:  # noqa: BLE001 - any failure means "not here"
        return str(e)
    return None


def guest_init(item) -> str:
    """How the guest a kernel test needs boots (marker ``guest_init``)."""
    m = item.get_closest_marker("guest_init")
    return m.args[0] if m else "shell"


def guest_flavours(item) -> list[str]:
    """Which Debians a kernel test runs on: each of ``PIPEXCTL_DEBIAN``
    (default "12,13", both; `make test DEBIAN=12` for one), except tests
    pinned to Debian 12 (marker ``debian12``: the bookworm .deb, the Ansible
    role's build on bookworm; and systemd as PID 1), which run there only,
    and tests marked ``one_debian`` (what the kernel and pppd version do not
    change), which run on the first of them only (docs/testing.md)."""
    if item.get_closest_marker("debian12") or guest_init(item) == "systemd":
        return ["debian12"]
    want = [v.strip() for v in os.environ.get("PIPEXCTL_DEBIAN", "12,13").replace(" ", ",").split(",") if v.strip()]
    if item.get_closest_marker("one_debian"):
        want = want[:1]
    return [f"debian{v}" for v in want]


class GuestRun:
    def __init__(self, config, nodeids: list[str], why_not_host: str, init: str = "shell",
                 flavour: str = "debian12") -> None:
        self.config, self.nodeids, self.why, self.init = config, nodeids, why_not_host, init
        self.flavour = flavour
        self.results: dict[str, dict] | None = None
        self.error: str | None = None
        self.console_tail = ""

    def _say(self, text: str) -> None:
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        cap = self.config.pluginmanager.get_plugin("capturemanager")
        if tr is None:
            return
        if cap is not None:
            with cap.global_and_fixture_disabled():
                tr.write_line(text)
        else:
            tr.write_line(text)

    def get(self) -> dict[str, dict]:
        if self.results is not None or self.error is not None:
            return self.results or {}
        from pipexctl.testing.vm import VMError, flavour, run_in_guest

        self._say(f"\n[kernel tests] host kernel cannot run them ({self.why}); booting the {self.flavour} guest "
                  f"({self.init} as PID 1) once for {len(self.nodeids)} tests ...")
        args = ROOT / f".pytest-guest-args-{self.flavour}-{self.init}"
        start = time.monotonic()
        try:
            with open(args, "w") as f:
                f.write("\n".join(self.nodeids) + "\n")
            verbose = ["-v"] if self.config.option.verbose > 0 else ["-q"]
            budget = int(float(os.environ.get("PIPEXCTL_VM_TIMEOUT", "3600"))) - 60
            cmd = ["timeout", "-k", "10", str(budget), flavour(self.flavour).python, "-m", "pytest", "-p", "no:cacheprovider", "-m", "kernel",
                   "--rootdir", str(ROOT), *verbose, f"@{args}"]
            import contextlib

            cap = self.config.pluginmanager.get_plugin("capturemanager")
            echo = self.config.option.verbose > 0
            # with -v the guest's own pytest output streams to the terminal
            with (cap.global_and_fixture_disabled() if cap and echo else contextlib.nullcontext()):
                r = run_in_guest(
                    f"PIPEXCTL_GUEST_REPORT=$PIPEXCTL_RESULTS/report.jsonl {shlex.join(cmd)}",
                    cwd=str(ROOT),
                    echo=echo,
                    timeout=float(os.environ.get("PIPEXCTL_VM_TIMEOUT", "3600")),
                    init=self.init,
                    flavour_name=self.flavour,
                )
        except VMError as e:
            self.error = f"kernel tests cannot run: the host lacks L2TP ({self.why}) and the guest failed: {e}"
            return {}
        finally:
            args.unlink(missing_ok=True)
        self.console_tail = "".join(r.console.splitlines(True)[-60:])
        self.results = {}
        report = r.results_dir / "report.jsonl"
        if report.exists():
            for line in report.read_text().splitlines():
                rec = json.loads(line)
                prev = self.results.get(rec["nodeid"])
                # keep the worst phase: a failed setup/teardown fails the test
                if prev is None or rec["outcome"] != "passed" and prev["outcome"] == "passed":
                    self.results[rec["nodeid"]] = rec
        self._say(f"[kernel tests] {self.flavour} guest ({self.init}) finished in {time.monotonic() - start:.0f} s "
                  f"(guest pytest exit status {r.returncode}, {len(self.results)} results)")
        slow = sorted(self.results.values(), key=lambda rec: -rec.get("duration", 0))
        self._say("[kernel tests] slowest in the guest (call phase): " + ", ".join(
            f"{rec['nodeid'].split('::')[-1]} {rec.get('duration', 0):.0f} s" for rec in slow[:12]))
        import shutil

        shutil.rmtree(r.results_dir, ignore_errors=True)
        return self.results


class GuestFailure(Exception):
    pass


class GuestItem(pytest.Item):
    """Stands for one kernel test that runs in the guest."""

    def __init__(self, *, guest: GuestRun, target_nodeid: str, **kw) -> None:
        super().__init__(**kw)
        self.guest, self.target_nodeid = guest, target_nodeid

    def runtest(self) -> None:
        results = self.guest.get()
        if self.guest.error:
            raise GuestFailure(self.guest.error)
        rec = results.get(self.target_nodeid)
        if rec is None:
            raise GuestFailure(f"{self.target_nodeid} did not run in the guest; console tail:\n{self.guest.console_tail}")
        if rec["outcome"] == "skipped":
            raise GuestFailure(f"skipped inside the guest ({rec['longrepr']}): kernel tests must not skip")
        if rec["outcome"] != "passed":
            raise GuestFailure(f"failed inside the guest ({rec['when']}):\n{rec['longrepr']}")

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, GuestFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"[guest] {self.target_nodeid}"


# after -m/-k deselection, so a guest runs only the tests selected
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    if GUEST_REPORT:
        return
    kernel = [i for i in items if i.get_closest_marker("kernel")]
    if not kernel:
        return
    why = _host_kernel_reason()
    if why is None:  # run here; a test that needs systemd as PID 1 checks that itself and fails if not
        return
    # one boot per (Debian, init): the shell guest on each Debian for most, systemd as PID 1 for the tests
    # that need Debian's boot; a test run on two Debians is two items ("name@debian13")
    keys = {i.nodeid: [(f, guest_init(i)) for f in guest_flavours(i)] for i in kernel}
    guests = {}
    for key in dict.fromkeys(k for ks in keys.values() for k in ks):
        guests[key] = GuestRun(config, [i.nodeid for i in kernel if key in keys[i.nodeid]], why,
                               init=key[1], flavour=key[0])
    out = []
    for item in items:
        if not item.get_closest_marker("kernel"):
            out.append(item)
            continue
        for key in keys[item.nodeid]:
            name = item.name if key[0] == "debian12" else f"{item.name}@{key[0]}"
            new = GuestItem.from_parent(item.parent, name=name, guest=guests[key], target_nodeid=item.nodeid)
            new.add_marker(pytest.mark.kernel)
            out.append(new)
    items[:] = out


def pytest_runtest_logreport(report):
    if not GUEST_REPORT:
        return
    if report.when == "call" or report.outcome != "passed":
        with open(GUEST_REPORT, "a") as f:
            f.write(json.dumps({
                "nodeid": report.nodeid,
                "when": report.when,
                "outcome": report.outcome,
                "longrepr": str(report.longrepr) if report.longrepr else "",
                "duration": report.duration,
            }) + "\n")
