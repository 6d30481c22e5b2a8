"""Boot Debian's kernel under QEMU and run one command in it, as root.

The machine pipexctl is developed and tested on has no L2TP and no PPP in its
own kernel.  This module boots the Debian ``linux-image-amd64`` kernel that
the project's set-up installs, with the host's root filesystem shared
read-only over 9p and a tmpfs overlay on top, so the guest runs the very same
Python, virtualenv, pppd and xl2tpd.  A second, writable 9p share (a fresh
temporary directory, mounted in the guest at the same path) carries the
command's results and its exit status back to the host.

Nothing here is mocked: the guest is a real Linux kernel with the real
l2tp_*, ppp_* and pppox modules.

Usage from the shell::

    python -m pipexctl.testing.vm -- ip l2tp show tunnel
    python -m pipexctl.testing.vm --cwd /work/main -- python -m pytest -m kernel

The exit status is the guest command's exit status, or 125 when the guest
could not be booted (the reason is printed).
"""

from __future__ import annotations

import argparse
import gzip
import io
import lzma
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# Modules the initramfs needs to reach the 9p root and build the overlay.
# Their dependencies are resolved from modules.dep, so the order and the
# exact set follow whatever kernel is installed.
INITRAMFS_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay", "virtio-rng")

BOOT_FAILED = 125

INIT_SCRIPT = r"""#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /lower /upper /root
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules.order); do insmod "/modules/$m" || echo "pipexctl-vm: insmod $m failed"; done
results=""
init=shell
share=""
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    pipexctl.results=*) results="${arg#pipexctl.results=}";;
    pipexctl.init=*) init="${arg#pipexctl.init=}";;
    pipexctl.share=*) share="${arg#pipexctl.share=}";;
  esac
done
fail() { echo "pipexctl-vm: $*"; echo "@@PIPEXCTL-VM-EXIT 125@@"; poweroff -f; }
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=524288,cache=loose hostroot /lower || fail "cannot mount the host root over 9p"
mount -t tmpfs -o mode=0755 tmpfs /upper || fail "cannot mount tmpfs"
mkdir -p /upper/data /upper/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work /root || fail "cannot mount the overlay"
for d in proc sys dev; do mount --move /$d /root/$d; done
mkdir -p /root/dev/pts /root/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /root/dev/pts
mount -t tmpfs tmpfs /root/dev/shm
mount -t tmpfs -o mode=0755 tmpfs /root/run
mkdir -p "/root$results"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 results "/root$results" || fail "cannot mount the results share"
if [ -n "$share" ]; then
  # a root of its own (debian13): the checkout comes in read-only at its own path
  mkdir -p "/root$share"
  mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=524288,cache=loose project "/root$share" || fail "cannot mount the checkout"
fi
# switch_root, not chroot: the kernel's module loader (request_module) runs
# /sbin/modprobe in PID 1's root, which must be the host's root.
if [ "$init" = systemd ]; then
  # Debian's boot as it is: systemd as PID 1 brings up multi-user.target
  # (journald, the sysv xl2tpd.service ...), then runs the command as a unit
  u=/root/etc/systemd/system
  mkdir -p $u
  # a container's marker on the host's root makes systemd think it runs in
  # one, and a container's PID 1 ignores the kernel command line (systemd.unit=)
  rm -f /root/.dockerenv /root/run/.containerenv
  for m in $(cat "/root$results/masked"); do ln -sf /dev/null "$u/$m"; done
  cat > $u/pipexctl-guest.service <<UNIT
[Unit]
Description=pipexctl guest command
Wants=multi-user.target
After=multi-user.target
[Service]
Type=oneshot
TimeoutStartSec=infinity
ExecStart=/bin/sh $results/guest.sh
StandardInput=null
StandardOutput=tty
StandardError=inherit
TTYPath=/dev/ttyS0
TTYReset=no
TTYVHangup=no
UNIT
  exec switch_root /root /lib/systemd/systemd
fi
exec switch_root /root /bin/sh "$results/guest.sh"
"""

# Runs inside the chroot (the host's root, overlaid).  Brings the machine to
# the state the tests expect, then runs the command.
GUEST_PRELUDE = r"""
set -u
export PIPEXCTL_IN_GUEST=1
export HOME=/root
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:${PATH_EXTRA:-}
mkdir -p /run/netns /run/xl2tpd /var/run
# under systemd (the systemd guest) /dev, the mounts and lo are made already
if [ ! -d /run/systemd/system ]; then
ip link set lo up
[ -L /dev/ptmx ] || { rm -f /dev/ptmx; ln -s pts/ptmx /dev/ptmx; }
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
for i in 0:stdin 1:stdout 2:stderr; do [ -e /dev/${i#*:} ] || ln -s /proc/self/fd/${i%%:*} /dev/${i#*:}; done
[ -d /sys/kernel/debug ] && mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
fi
"""

# Units of the host's root that a test guest must not start under systemd:
# a database, timers that run apt or fstrim, logins on the console (the
# command's output goes there).
SYSTEMD_MASKED = (
    "postgresql.service", "postgresql@.service", "e2scrub_reap.service", "getty@tty1.service",
    "serial-getty@ttyS0.service", "apt-daily.timer", "apt-daily-upgrade.timer", "dpkg-db-backup.timer",
    "e2scrub_all.timer", "fstrim.timer", "man-db.timer", "systemd-timesyncd.service", "systemd-pstore.service",
    "rsyslog.service",  # installed for a shell-guest test; the systemd guest's log is the journal alone
)
INITS = ("shell", "systemd")


@dataclass(frozen=True)
class Flavour:
    """A guest's root filesystem and the Python that runs tests in it."""

    name: str
    root: Path  # shared read-only over 9p as the guest's lower layer
    python: str  # the interpreter of the test command inside
    env: tuple[tuple[str, str], ...] = ()
    # QEMU's -accel; PIPEXCTL_VM_ACCEL overrides it (docs/testing.md)
    accel: str = "tcg"


PROJECT = Path(__file__).resolve().parents[2]


def flavour(name: str) -> Flavour:
    """debian12: the host's own root (Debian 12, kernel 6.1, pppd 2.4.9).
    debian13: the trixie root `make setup` builds (kernel 6.12, pppd 2.5.2,
    Python 3.13, scripts/debian13_root.sh); the checkout is shared into it
    read-only at its own path."""
    if name == "debian12":
        return Flavour("debian12", Path("/"), sys.executable)
    if name == "debian13":
        root = PROJECT / ".cache" / "debian13-root"
        if not (root / "opt/pipexctl-venv/bin/python").exists():
            raise VMError(f"{root} is missing or incomplete: run `make setup` (scripts/debian13_root.sh builds it)")
        v = next((p.name for p in sorted((root / "usr/lib/pppd").glob("2.*"))), "")
        # One TCG thread for all vCPUs: with one thread per vCPU, 6.12 under
        # Debian 12's QEMU dies now and then on a stale int3 of its own live
        # code patching ("Oops: int3", docs/testing.md); 6.1 has not.
        return Flavour("debian13", root, "/opt/pipexctl-venv/bin/python",
                       (("PYTHONPATH", str(PROJECT)), ("PIPEXCTL_PLUGIN", f"/usr/lib/pppd/{v}/pipexctl.so")),
                       accel="tcg,thread=single")
    raise VMError(f"unknown guest flavour {name!r} (debian12, debian13)")


FLAVOURS = ("debian12", "debian13")


class VMError(RuntimeError):
    """The guest could not be booted; the message says why."""


@dataclass
class GuestResult:
    returncode: int
    results_dir: Path
    console: str = ""
    boot_seconds: float = 0.0
    total_seconds: float = 0.0
    files: dict[str, str] = field(default_factory=dict)


def find_kernel(root: Path = Path("/")) -> tuple[Path, str]:
    """The newest kernel image under ``root`` that has L2TP modules."""
    candidates = []
    for image in (root / "boot").glob("vmlinuz-*"):
        version = image.name[len("vmlinuz-"):]
        moddir = root / "lib/modules" / version
        if (moddir / "kernel/net/l2tp").is_dir() and (moddir / "modules.dep").is_file():
            candidates.append((image.stat().st_mtime, image, version))
    if not candidates:
        raise VMError(
            f"no kernel with L2TP modules found in {root}/boot and {root}/lib/modules: "
            "run `make setup` (it installs Debian's linux-image-amd64)"
        )
    candidates.sort()
    _, image, version = candidates[-1]
    if not os.access(image, os.R_OK):
        raise VMError(f"{image} is not readable (run as root)")
    return image, version


def _module_closure(version: str, names: tuple[str, ...], root: Path = Path("/")) -> list[Path]:
    """Module files for ``names`` and their dependencies, dependencies first."""
    moddir = root / "lib/modules" / version
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (moddir / "modules.dep").read_text().splitlines():
        path, _, rest = line.partition(":")
        deps[path] = rest.split()
        base = os.path.basename(path)
        base = re.sub(r"\.ko(\.(xz|zst|gz))?$", "", base)
        by_name[base] = path
        by_name[base.replace("-", "_")] = path
    builtin = set()
    if (moddir / "modules.builtin").is_file():
        for line in (moddir / "modules.builtin").read_text().splitlines():
            base = re.sub(r"\.ko$", "", os.path.basename(line))
            builtin |= {base, base.replace("-", "_")}
    order: list[str] = []

    def visit(path: str) -> None:
        if path in order:
            return
        for dep in deps.get(path, []):
            visit(dep)
        order.append(path)

    for name in names:
        found = by_name.get(name) or by_name.get(name.replace("-", "_"))
        if found is None and (name in builtin or name.replace("-", "_") in builtin):
            continue  # built into this kernel (Debian 13: virtio_pci)
        if found is None:
            if name == "virtio-rng":
                continue  # optional: only speeds up the entropy pool
            raise VMError(f"kernel {version} has no module {name}")
        visit(found)
    files = [moddir / p for p in order]
    for f in files:
        if not f.name.endswith((".ko", ".ko.xz")):
            raise VMError(f"{f}: only plain and xz-compressed modules are supported by the initramfs builder")
    return files


def _module_bytes(path: Path) -> tuple[str, bytes]:
    """A module's name and contents for insmod (Debian 13 compresses modules with xz)."""
    if path.name.endswith(".xz"):
        return path.name[:-3], lzma.decompress(path.read_bytes())
    return path.name, path.read_bytes()


def _cpio_newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive of (name, mode, data) entries."""
    out = io.BytesIO()
    ino = 1
    for name, mode, data in entries + [("TRAILER!!!", 0, b"")]:
        namez = name.encode() + b"\0"
        header = "070701" + "".join(
            f"{v:08x}"
            for v in (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(namez), 0)
        )
        out.write(header.encode())
        out.write(namez)
        out.write(b"\0" * ((4 - (110 + len(namez)) % 4) % 4))
        out.write(data)
        out.write(b"\0" * ((4 - len(data) % 4) % 4))
        ino += 1
    return out.getvalue()


def build_initramfs(version: str, dest: Path, root: Path = Path("/")) -> Path:
    busybox = Path("/bin/busybox")
    if not busybox.exists():
        raise VMError("/bin/busybox missing: run `make setup` (it installs busybox-static)")
    mods = [_module_bytes(m) for m in _module_closure(version, INITRAMFS_MODULES, root)]
    d = stat.S_IFDIR | 0o755
    f = stat.S_IFREG | 0o755
    entries = [("bin", d, b""), ("modules", d, b""), ("proc", d, b""), ("sys", d, b""), ("dev", d, b"")]
    entries.append(("bin/busybox", f, busybox.read_bytes()))
    entries.append(("init", f, INIT_SCRIPT.encode()))
    entries.append(("modules.order", stat.S_IFREG | 0o644, "\n".join(name for name, _ in mods).encode() + b"\n"))
    for name, data in mods:
        entries.append((f"modules/{name}", stat.S_IFREG | 0o644, data))
    dest.write_bytes(gzip.compress(_cpio_newc(entries), compresslevel=1))
    return dest


def qemu_binary() -> str:
    path = shutil.which("qemu-system-x86_64")
    if not path:
        raise VMError("qemu-system-x86_64 not found: run `make setup` (it installs qemu-system-x86)")
    return path


def run_in_guest(
    command: list[str] | str,
    *,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    memory_mb: int = 2048,
    cpus: int = 2,
    timeout: float = 1500.0,
    echo: bool = True,
    keep_results: bool = False,
    progress: bool = False,
    files: dict[str, str] | None = None,
    init: str = "shell",
    flavour_name: str = "debian12",
) -> GuestResult:
    """Boot the guest, run ``command`` as root in ``cwd`` and power off.

    ``files`` maps names to text written into the shared results directory
    before boot (the guest sees them at ``$PIPEXCTL_RESULTS/<name>``).
    Everything the command writes below ``$PIPEXCTL_RESULTS`` comes back in
    ``GuestResult.results_dir``.

    ``init``: "shell" runs the command as PID 1's child right after the
    overlay is up (seconds); "systemd" boots systemd as PID 1 to
    multi-user.target first and runs the command as a unit after it.
    """
    if init not in INITS:
        raise VMError(f"unknown guest init {init!r} (one of {', '.join(INITS)})")
    if os.geteuid() != 0:
        raise VMError("the test VM must be started as root (it shares / over 9p with passthrough)")
    fl = flavour(flavour_name)
    if init == "systemd" and fl.name != "debian12":
        raise VMError("the systemd guest runs on the debian12 flavour only (the debian13 root has no systemd)")
    image, version = find_kernel(fl.root)
    qemu = qemu_binary()
    results = Path(tempfile.mkdtemp(prefix="pipexctl-vm-"))
    os.chmod(results, 0o755)
    initrd = build_initramfs(version, results / "initramfs.gz", fl.root)
    cmd = command if isinstance(command, str) else shlex.join(command)
    script = [GUEST_PRELUDE, f"export PIPEXCTL_RESULTS={shlex.quote(str(results))}",
              f"export PIPEXCTL_GUEST_FLAVOUR={fl.name}"]
    for k, v in [*fl.env, *(env or {}).items()]:
        script.append(f"export {k}={shlex.quote(v)}")
    where = shlex.quote(cwd or os.getcwd())
    # PID 1 must never exit before the poweroff below (the kernel would panic)
    script.append(f"if cd {where}; then")
    script.append(f"  ( {cmd} )")
    script.append("  status=$?")
    script.append("else")
    script.append(f'  echo "pipexctl-vm: cannot cd to {where} in the guest"; status=126')
    script.append("fi")
    script.append(f'echo "$status" > {shlex.quote(str(results))}/exit-status')
    script.append('echo "@@PIPEXCTL-VM-EXIT $status@@"')
    script.append("sync")
    script.append("/bin/busybox poweroff -f || echo o > /proc/sysrq-trigger")
    script.append("sleep 10")
    (results / "guest.sh").write_text("\n".join(script) + "\n")
    (results / "masked").write_text("\n".join(SYSTEMD_MASKED) + "\n")
    for name, text in (files or {}).items():
        (results / name).write_text(text)

    argv = [
        qemu,
        "-accel", os.environ.get("PIPEXCTL_VM_ACCEL", fl.accel),
        "-m", str(memory_mb),
        "-smp", str(cpus),
        # e.g. "max": TCG then emulates AES-NI, as a server's CPU has it (the ESP rows)
        *(["-cpu", os.environ["PIPEXCTL_VM_CPU"]] if os.environ.get("PIPEXCTL_VM_CPU") else []),
        "-display", "none", "-monitor", "none", "-serial", "stdio",
        "-no-reboot",
        "-kernel", str(image),
        "-initrd", str(initrd),
        "-append", f"console=ttyS0 quiet loglevel=3 panic=-1 random.trust_cpu=on pipexctl.results={results} pipexctl.init={init}"
        + (f" pipexctl.share={PROJECT}" if fl.root != Path("/") else "")
        + (" systemd.unit=pipexctl-guest.service systemd.show_status=false" if init == "systemd" else ""),
        "-virtfs", f"local,path={fl.root},mount_tag=hostroot,security_model=passthrough,readonly=on,multidevs=remap",
        "-virtfs", f"local,path={results},mount_tag=results,security_model=passthrough,multidevs=remap",
        *(["-virtfs", f"local,path={PROJECT},mount_tag=project,security_model=passthrough,readonly=on,multidevs=remap"]
          if fl.root != Path("/") else []),
        "-device", "virtio-rng-pci",
        "-nic", "none",
    ]
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    console: list[str] = []
    marker = re.compile(r"@@PIPEXCTL-VM-EXIT (\d+)@@")
    marker_status: list[int] = []
    boot_done: list[float] = []

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").replace("\r", "")
            console.append(line)
            m = marker.search(line)
            if m:
                marker_status.append(int(m.group(1)))
                continue
            if not boot_done:
                boot_done.append(time.monotonic() - start)
            if echo and not re.search(r"\] reboot: Power down", line):
                sys.stdout.write(line)
                sys.stdout.flush()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    spinner = None
    if progress and sys.stderr.isatty():
        spinner = _Spinner("booting the Debian-kernel guest", lambda: bool(boot_done))
        spinner.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        t.join(5)
        raise VMError(f"guest did not finish within {timeout:.0f} s (killed); console tail:\n"
                      f"{''.join(console[-30:])}") from None
    finally:
        if spinner:
            spinner.stop()
    t.join(5)
    total = time.monotonic() - start
    status_file = results / "exit-status"
    if status_file.exists():
        rc = int(status_file.read_text().strip() or BOOT_FAILED)
    elif marker_status:
        rc = marker_status[-1]
    else:
        (results / "console.log").write_text("".join(console))  # a kernel oops starts above the tail
        raise VMError(
            f"guest exited (qemu status {proc.returncode}) without reporting a status (whole console: "
            f"{results}/console.log); console tail:\n" + "".join(console[-40:])
        )
    result = GuestResult(rc, results, "".join(console), boot_done[0] if boot_done else total, total)
    if not keep_results:
        initrd.unlink(missing_ok=True)
    return result


class _Spinner(threading.Thread):
    def __init__(self, text: str, booted: Callable[[], bool]) -> None:
        super().__init__(daemon=True)
        self.text, self.booted, self._stop = text, booted, threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        frames = "|/-\\"
        i = 0
        while not self._stop.wait(0.2):
            if self.booted():
                break
            sys.stderr.write(f"\r{frames[i % 4]} {self.text} ({time.monotonic() - start:4.1f} s)")
            sys.stderr.flush()
            i += 1
        sys.stderr.write("\r" + " " * 60 + "\r")
        sys.stderr.flush()

    def stop(self) -> None:
        self._stop.set()
        self.join(1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipexctl.testing.vm", description=__doc__.split("\n\n")[0])
    p.add_argument("--cwd", default=os.getcwd())
    p.add_argument("--memory", type=int, default=2048, help="guest memory in MiB")
    p.add_argument("--cpus", type=int, default=2)
    p.add_argument("--timeout", type=float, default=1500.0)
    p.add_argument("--flavour", choices=FLAVOURS, default="debian12",
                   help="debian13: boot the trixie root `make setup` builds (kernel 6.12, pppd 2.5.2)")
    p.add_argument("--init", choices=INITS, default="shell",
                   help="systemd: boot systemd as PID 1 to multi-user.target, then run the command as a unit")
    p.add_argument("--keep-results", metavar="DIR", help="copy the guest's $PIPEXCTL_RESULTS here afterwards")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        p.error("no command given")
    try:
        r = run_in_guest(cmd, cwd=a.cwd, memory_mb=a.memory, cpus=a.cpus, timeout=a.timeout, progress=True,
                         init=a.init, flavour_name=a.flavour)
    except VMError as e:
        print(f"pipexctl-vm: {e}", file=sys.stderr)
        return BOOT_FAILED
    print(f"pipexctl-vm: guest exit status {r.returncode} ({r.total_seconds:.1f} s)", file=sys.stderr)
    if a.keep_results:
        shutil.copytree(r.results_dir, a.keep_results, dirs_exist_ok=True)
    shutil.rmtree(r.results_dir, ignore_errors=True)
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
