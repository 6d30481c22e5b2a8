"""An xl2tpd + pppd lab in network namespaces (for tests, the demo and benchmarks).

One LNS namespace and any number of LAC namespaces, each LAC joined to the
LNS by its own veth (LNS side 10.99.<n>.1, LAC side 10.99.<n>.2).  Each
namespace runs its own Debian xl2tpd (own config, control pipe, pid file and
log), started with ``-D`` so its log goes to a file we read.  Must run as
root in a kernel with L2TP/PPP (the guest).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional

from ..discovery.control import write_request
from ..offload.client import ask
from .probe import ip_json

# a LAC's call that its LNS will refuse: a remote call id of 0 (Lab.connect)
XL2TPD_BROKEN_CALL = re.compile(r"Call established with \S+, Local: \d+, Remote: 0,")

PPP_OPTS_COMMON = """noauth
nodefaultroute
noccp
novj
nobsdcomp
nodeflate
mtu 1400
mru 1400
lcp-echo-interval 0
"""
# pppd's own defaults as Debian ships them: compression left to negotiation
PPP_OPTS_STOCK = """noauth
nodefaultroute
"""


@dataclass
class Instance:
    name: str
    ns: str
    role: str  # "lns" or "lac"
    dir: Path
    local: str
    peer: str = ""
    port: int = 1701  # its xl2tpd's UDP port
    proc: subprocess.Popen[bytes] | None = None
    log_file: Optional[BinaryIO] = None

    @property
    def control(self) -> str:
        return str(self.dir / "l2tp-control")

    @property
    def log(self) -> Path:
        return self.dir / "xl2tpd.log"

    @property
    def pidfile(self) -> str:
        return str(self.dir / "xl2tpd.pid")


@dataclass
class Lab:
    kernel_mode: bool = False
    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="pxlab-")))
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])
    _lns: Instance | None = None  # made by setup(): read it as `lns`
    lacs: list[Instance] = field(default_factory=list)
    serves: list[subprocess.Popen[bytes]] = field(default_factory=list)
    sections: int = 1  # [lac] sections per LAC, each its own tunnel: "lns", "lns2", ...
    lns_global: str = ""  # extra [global] lines of the LNS's xl2tpd.conf
    lac_global: str = ""  # extra [global] lines of every LAC's xl2tpd.conf
    serve_nice: int = 0  # `pipexctl serve` under nice(1) when not 0 (nice execs: the daemon keeps the pid)
    lns_env: dict[str, str] = field(default_factory=dict)  # extra environment of the LNS's xl2tpd
    # extra arguments of the LNS's xl2tpd: ("-l",) logs through syslog (a syslogd must write its log file)
    lns_args: tuple[str, ...] = ()
    # what the LNS's daemon reads (`serve --log`) when not the LNS's log file: "journal-id:xl2tpd" for
    # an xl2tpd logging into the journal (journal_copy keeps the file the lab's own waits read)
    lns_log_source: str = ""
    ppp_opts: str = PPP_OPTS_COMMON  # the first lines of every pppd options file
    lac_kernel_mode: bool | None = None  # the LACs' xl2tpd mode when it differs from the LNS's
    lac_extra_pppd: str | None = None  # the LACs' pppd lines when they differ from the LNS's (write_configs)
    # the LNS's local PPP address and its peers' pool; >249 calls need a wider one (scale runs)
    pool: tuple[str, str, str] = ("10.99.100.1", "10.99.100.2", "10.99.100.250")

    @property
    def lns(self) -> Instance:
        if self._lns is None:
            raise RuntimeError("the lab is not set up: Lab.setup() first")
        return self._lns

    def instances(self, lacs_first: bool = False) -> list[Instance]:
        """Its xl2tpd instances made so far: the LNS and the LACs."""
        lns = [self._lns] if self._lns is not None else []
        return [*self.lacs, *lns] if lacs_first else [*lns, *self.lacs]

    def _sh(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(cmd), check=check, capture_output=True, text=True)

    # ---- topology
    def setup(self, n_lacs: int = 1) -> "Lab":
        subprocess.run(["modprobe", "-a", "l2tp_ppp", "ppp_generic"], capture_output=True)
        lns_ns = f"lns{self.tag}"
        self._sh("ip", "netns", "add", lns_ns)
        self._sh("ip", "-n", lns_ns, "link", "set", "lo", "up")
        self._lns = Instance("lns", lns_ns, "lns", self.base / "lns", "10.99.1.1")
        self.lns.dir.mkdir(parents=True)
        if n_lacs > 153:
            raise ValueError("at most 153 LACs: each has its own 10.99.X.0/24, and 10.99.100.0/24 is the calls'")
        for i in range(1, n_lacs + 1):
            ns = f"lac{i}{self.tag}"
            net = f"10.99.{i if i < 100 else i + 1}"
            self._sh("ip", "netns", "add", ns)
            self._sh("ip", "-n", ns, "link", "set", "lo", "up")
            self._sh("ip", "link", "add", f"l{i}", "netns", lns_ns, "type", "veth", "peer", "name", "v0", "netns", ns)
            self._sh("ip", "-n", lns_ns, "addr", "add", f"{net}.1/24", "dev", f"l{i}")
            self._sh("ip", "-n", ns, "addr", "add", f"{net}.2/24", "dev", "v0")
            self._sh("ip", "-n", lns_ns, "link", "set", f"l{i}", "up")
            self._sh("ip", "-n", ns, "link", "set", "v0", "up")
            inst = Instance(f"lac{i}", ns, "lac", self.base / f"lac{i}", f"{net}.2", peer=f"{net}.1")
            inst.dir.mkdir(parents=True)
            self.lacs.append(inst)
        return self

    def add_lac_beside(self, first: Instance, port: int) -> Instance:
        """Another LAC xl2tpd in ``first``'s namespace and address, on UDP
        ``port`` (two LACs behind one NAT address), started; its config is
        ``first``'s (written by start_all) with its own port and files."""
        inst = Instance(f"{first.name}-{port}", first.ns, "lac", first.dir.parent / f"{first.name}-{port}",
                        first.local, peer=first.peer, port=port)
        inst.dir.mkdir()
        (inst.dir / "options").write_text((first.dir / "options").read_text()
                                          .replace(f"logfile {first.dir}/", f"logfile {inst.dir}/"))
        (inst.dir / "xl2tpd.conf").write_text((first.dir / "xl2tpd.conf").read_text()
                                              .replace(f"port = {first.port}", f"port = {port}")
                                              .replace(f"{first.dir}/options", f"{inst.dir}/options"))
        self.lacs.append(inst)  # stopped, and its logs kept, with the lab's
        self.start(inst)
        return inst

    # ---- configuration
    def _global(self, listen: str | None, extra: str = "", kernel_mode: bool | None = None, port: int = 1701) -> str:
        g = f"[global]\nport = {port}\n" + extra
        if listen:
            g += f"listen-addr = {listen}\n"
        if not (self.kernel_mode if kernel_mode is None else kernel_mode):
            g += "force userspace = yes\n"
        return g

    def write_configs(self, extra_pppd: str = "") -> None:
        """``extra_pppd`` may use ``{sock}``: the instance's pipexctl serve socket."""
        (self.lns.dir / "options").write_text(
            self.ppp_opts + f"logfile {self.lns.dir}/pppd.log\nms-dns 10.99.200.1\n"
            + extra_pppd.format(sock=self.serve_socket(self.lns)))
        self.lns.dir.joinpath("xl2tpd.conf").write_text(
            self._global(None, self.lns_global)
            + f"""
[lns default]
ip range = {self.pool[1]}-{self.pool[2]}
local ip = {self.pool[0]}
require authentication = no
refuse chap = yes
refuse pap = yes
name = lns
length bit = yes
pppoptfile = {self.lns.dir}/options
"""
        )
        for lac in self.lacs:
            (lac.dir / "options").write_text(self.ppp_opts + f"logfile {lac.dir}/pppd.log\n"
                                             + "ipcp-accept-local\nipcp-accept-remote\n"
                                             + (extra_pppd if self.lac_extra_pppd is None
                                                else self.lac_extra_pppd).format(sock=self.serve_socket(lac)))
            g = self._global(lac.local, self.lac_global, self.lac_kernel_mode, lac.port)
            lac.dir.joinpath("xl2tpd.conf").write_text(g + "".join(
                f"""
[lac {name}]
lns = {lac.peer}
require authentication = no
refuse chap = yes
refuse pap = yes
name = {lac.name}
length bit = yes
redial = no
pppoptfile = {lac.dir}/options
""" for name in self.section_names()))

    def section_names(self) -> list[str]:
        return ["lns"] + [f"lns{i}" for i in range(2, self.sections + 1)]

    # ---- pipexctl serve
    def serve_socket(self, inst: Instance) -> str:
        return f"/run/pipexctl-{inst.ns}/serve.sock"

    def serve_status(self, inst: Instance) -> dict[str, Any]:
        """The daemon's ``status`` reply (tunnels, stats, reconcile, latency)."""
        return ask(self.serve_socket(inst), {"op": "status"})

    def serve(self, inst: Instance, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start `pipexctl serve` in ``inst``'s namespace, following its xl2tpd
        (``env``: added to its environment)."""
        return self.serve_all([inst], *extra, env=env)[0]

    def serve_all(self, insts: list[Instance] | None = None, *extra: str,
                  env: dict[str, str] | None = None) -> list[subprocess.Popen[bytes]]:
        """Start one `pipexctl serve` per instance at once (default: all), then
        wait until each accepts (Python starts slowly under TCG: ~10 s each)."""
        insts = insts if insts is not None else self.instances()
        procs = []
        for inst in insts:
            out = open(inst.dir / "serve.log", "ab")
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", inst.ns, *(("nice", "-n", str(self.serve_nice)) if self.serve_nice else ()),
                 sys.executable, "-m", "pipexctl", "serve", "-v",
                 "--socket", self.serve_socket(inst),
                 "--log", self.lns_log_source if inst is self.lns and self.lns_log_source else str(inst.log),
                 "--control", inst.control, *extra],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **(env or {})}))
            out.close()
        self.serves += procs
        end = time.monotonic() + 90
        for inst, p in zip(insts, procs):
            while not _accepts(self.serve_socket(inst)):  # a killed daemon's socket file may still be there
                if p.poll() is not None or time.monotonic() > end:
                    raise RuntimeError(f"pipexctl serve did not start: {(inst.dir / 'serve.log').read_text()[-2000:]}")
                time.sleep(0.1)
        return procs

    # ---- processes
    def start(self, inst: Instance) -> None:
        offset = inst.log.stat().st_size if inst.log.exists() else 0
        inst.log_file = open(inst.log, "ab")
        inst.proc = subprocess.Popen(
            ["ip", "netns", "exec", inst.ns, "xl2tpd", "-D", "-c", str(inst.dir / "xl2tpd.conf"),
             "-p", inst.pidfile, "-C", inst.control, *(self.lns_args if inst is self.lns else ())],
            stdout=inst.log_file, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **(self.lns_env if inst is self.lns else {})},
        )
        self.wait_log(inst, "Listening on IP address", timeout=15, offset=offset)

    def start_all(self, extra_pppd: str = "") -> None:
        self.write_configs(extra_pppd)
        self.start(self.lns)
        for lac in self.lacs:
            self.start(lac)

    def control(self, inst: Instance, line: str, timeout: float = 10) -> None:
        """Write one request to the control pipe, as `echo ... > pipe` does,
        and wait until xl2tpd has read it: xl2tpd 1.3.18 takes one read() as
        one request, so two requests in the pipe at once become one garbled
        one ("No such tunnel 'lns2\\nc'")."""
        end = time.monotonic() + timeout
        # xl2tpd just started may not have opened its end yet: wait for it the whole timeout
        fd = write_request(inst.control, (line + "\n").encode(), timeout, timeout)
        try:
            while struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]:
                if time.monotonic() > end:
                    raise TimeoutError(f"{inst.name}: xl2tpd did not read {line!r} from its control pipe")
                time.sleep(0.02)
        finally:
            os.close(fd)

    def connect(self, lac: Instance, timeout: float = 30, section: str = "lns") -> None:
        """Bring up one call from ``lac`` and wait for xl2tpd to establish it.

        Now and then, in a redial soon after a hang-up, xl2tpd 1.3.18's LAC
        logs its call established with a remote call id of 0; the LNS then
        refuses its ICCN and closes the tunnel before any pppd starts.  Such
        a call is redialled once, when its tunnel has closed, said on stderr
        (docs/testing.md)."""
        for attempt in (1, 2):
            start = lac.log.stat().st_size
            self.control(lac, f"c {section}")
            data = self.wait_log(lac, "Call established", timeout=timeout, offset=start)
            broken = XL2TPD_BROKEN_CALL.search(data)
            if broken is None or attempt == 2:
                return
            print(f"lab: {lac.name}: xl2tpd established a call with remote call id 0 (its redial bug); "
                  "redialling once", file=sys.stderr)
            # the close after that line, not an earlier tunnel's
            self.wait_log(lac, "Connection closed to", timeout=timeout,
                          offset=start + len(data[:broken.end()].encode()))

    def disconnect(self, lac: Instance, section: str = "lns") -> None:
        self.control(lac, f"d {section}")

    def kill(self, inst: Instance, sig: int = signal.SIGTERM) -> None:
        if inst.proc and inst.proc.poll() is None:
            os.killpg(inst.proc.pid, sig)
            try:
                inst.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(inst.proc.pid, signal.SIGKILL)
                inst.proc.wait(5)

    def wait_log(self, inst: Instance, text: str, timeout: float = 30, offset: int = 0, count: int = 1) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            data = inst.log.read_bytes()[offset:].decode("utf-8", "replace")
            if data.count(text) >= count:
                return data
            if inst.proc and inst.proc.poll() is not None:
                raise RuntimeError(f"{inst.name} xl2tpd exited ({inst.proc.returncode}):\n{data[-2000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"{inst.name}: no {text!r} in {timeout} s; log tail:\n{inst.log.read_text()[-3000:]}")

    def pppds(self, inst: Instance) -> list[int]:
        """PIDs of the pppd children of ``inst``'s xl2tpd."""
        if not inst.proc:
            return []
        xpid = xl2tpd_pid(inst)
        out = []
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    stat = (p / "stat").read_text()
                except OSError:
                    continue
                fields = stat[stat.rfind(")") + 2:].split()
                if int(fields[1]) == xpid and "pppd" in stat[: stat.rfind(")")]:
                    out.append(int(p.name))
        return out

    def teardown(self, keep_as: str | None = None) -> None:
        """Stop everything and remove the namespaces.  ``keep_as``: when
        the guest brings results back ($PIPEXCTL_RESULTS), first keep the
        logs under that name there ("" for the results directory itself)."""
        results = os.environ.get("PIPEXCTL_RESULTS")
        if keep_as is not None and results:
            dest = Path(results) / keep_as.replace("/", "_")
            dest.mkdir(exist_ok=True)
            self.keep_logs(dest)
        for p in self.serves:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for inst in self.instances(lacs_first=True):
            self.kill(inst)
            if inst.log_file:
                inst.log_file.close()
        subprocess.run(["pkill", "-f", f"pppd.*{self.base}"], capture_output=True)
        for inst in self.instances(lacs_first=True):
            subprocess.run(["ip", "netns", "del", inst.ns], capture_output=True)

    def __enter__(self) -> "Lab":
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def tails(self, chars: int = 1500) -> str:
        """The end of every log of the lab (xl2tpd, pppd, serve), for a failure message."""
        out = []
        for inst in self.instances():
            for f in (inst.log, inst.dir / "pppd.log", inst.dir / "serve.log"):
                if f.exists():
                    out.append(f"----- {inst.name}/{f.name} (last {chars} chars)\n"
                               + f.read_text(errors="replace")[-chars:])
        return "\n" + "\n".join(out)

    def keep_logs(self, dest: Path) -> None:
        for inst in self.instances():
            if inst.log.exists():
                shutil.copy(inst.log, dest / f"{inst.name}-{'kernel' if self.kernel_mode else 'user'}.log")
            for extra in ("serve.log", "pppd.log"):
                if (inst.dir / extra).exists():
                    shutil.copy(inst.dir / extra, dest / f"{inst.name}-{extra}")


def kernel_objects(ns: str) -> dict[str, int]:
    """What independent tools see in ``ns``: iproute2's L2TP tunnels and
    sessions, /proc/net/pppol2tp's PPP sessions, nft's steering rules, PPP
    links."""
    def run(*c: str) -> str:
        return subprocess.run(list(c), capture_output=True, text=True).stdout

    l2tp = run("ip", "-n", ns, "l2tp", "show", "session") + run("ip", "-n", ns, "l2tp", "show", "tunnel")
    pppol2tp = run("ip", "netns", "exec", ns, "cat", "/proc/net/pppol2tp")
    try:
        nft = json.loads(run("ip", "netns", "exec", ns, "nft", "-j", "list", "table", "ip", "pipexctl"))["nftables"]
    except (ValueError, KeyError):
        nft = []
    links = ip_json(ns, "link", "show")
    return {
        "tunnels": len(re.findall(r"^Tunnel \d+", l2tp, re.M)),
        "sessions": len(re.findall(r"^Session \d+", l2tp, re.M)),
        # the kernel's PPPoL2TP listing: "  SESSION 'name' ..." per PPP session
        "pppol2tp_sessions": len(re.findall(r"^\s+SESSION '", pppol2tp, re.M)),
        "nft_rules": sum(1 for i in nft if "rule" in i),
        "ppp_links": sum(1 for i in links if i["ifname"].startswith("ppp")),
    }


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def pty_fds(pid: int) -> list[str]:
    """The ptys a pppd talks on: its fds on a /dev/pts, leaving out the one
    copy the plugin keeps of a pty it gave the daemon at pppd's start
    (above stderr, close-on-exec, never read: the way back for a move to
    the pty)."""
    fds = {}
    for f in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{f}")
            if target.startswith("/dev/pts/"):
                with open(f"/proc/{pid}/fdinfo/{f}") as fh:
                    flags = int(re.search(r"^flags:\s+(\d+)", fh.read(), re.M)[1], 8)  # type: ignore[index]
                fds[int(f)] = (target, flags)
        except OSError:  # closed meanwhile
            continue
    kept = [f for f, (_, flags) in fds.items() if f > 2 and flags & os.O_CLOEXEC][:1]
    return [t for f, (t, _) in sorted(fds.items()) if f not in kept]


def fd_kinds(pid: int) -> dict[str, int]:
    """A process's open fds by kind ("socket", "pipe", "/dev/pts/*", "anon_inode:...", paths)."""
    inodes: dict[str, str] = {}  # socket inode -> protocol, from the process's /proc/net tables
    for proto, col in (("udp", 9), ("udp6", 9), ("tcp", 9), ("unix", 6), ("netlink", 9), ("raw", 9)):
        try:
            with open(f"/proc/{pid}/net/{proto}") as fh:
                next(fh)
                for line in fh:
                    parts = line.split()
                    if len(parts) > col:
                        inodes[parts[col]] = proto
        except (OSError, StopIteration):
            pass
    out: collections.Counter[str] = collections.Counter()
    for f in os.listdir(f"/proc/{pid}/fd"):
        try:
            t = os.readlink(f"/proc/{pid}/fd/{f}")
        except OSError:
            continue
        m = re.match(r"^socket:\[(\d+)\]$", t)
        if m:
            t = f"socket:{inodes.get(m[1], 'other')}"
        out[re.sub(r"^pipe:\[\d+\]$", "pipe", re.sub(r"^/dev/pts/\d+$", "/dev/pts/*", t))] += 1
    return dict(out)


def _accepts(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def xl2tpd_pid(inst: Instance) -> int:
    """The pid of ``inst``'s xl2tpd (its pid file; the process the lab started before it writes one)."""
    try:
        return int(Path(inst.pidfile).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return inst.proc.pid if inst.proc else -1


def plugin_path() -> str:
    """The pppd plugin built in the checkout (plugins/pipexctl.so), or the
    guest's own build for its pppd (PIPEXCTL_PLUGIN: the Debian 13 guest's
    pppd 2.5.2 loads no plugin built for 2.4.9)."""
    return os.environ.get("PIPEXCTL_PLUGIN") or str(Path(__file__).resolve().parents[2] / "plugins" / "pipexctl.so")


def plugin_options(required: bool = True) -> str:
    """pppd options that load the plugin; ``{sock}`` is filled in per instance."""
    return f"plugin {plugin_path()}\npipexctl_socket {{sock}}\n" + ("pipexctl_required\n" if required else "")


def wait_ppp(ns: str, timeout: float = 40) -> bool:
    """Wait until IPCP gave ``ns`` an address in the lab's PPP range."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        out = subprocess.run(["ip", "-n", ns, "-br", "addr"], capture_output=True, text=True).stdout
        if "10.99.100." in out:
            return True
        time.sleep(0.2)
    return False


def iperf(server_ns: str, client_ns: str, addr: str, seconds: int, streams: int = 1, reverse: bool = False) -> float:
    """iperf3 TCP throughput in Mbit/s (received), server in ``server_ns``."""
    bps: float = iperf_received(server_ns, client_ns, addr, seconds, streams, reverse)["bits_per_second"]
    return bps / 1e6


def iperf_received(server_ns: str, client_ns: str, addr: str, seconds: int, streams: int = 1,
                   reverse: bool = False) -> dict[str, Any]:
    """iperf3's ``end.sum_received`` (bytes, bits_per_second, ...) of one TCP run, with its own server."""
    with iperf_server(server_ns, addr):
        return iperf_client(client_ns, addr, seconds, streams, reverse)


IPERF_PORT = 5201


@contextlib.contextmanager
def iperf_server(ns: str, addr: str, timeout: float = 10) -> Iterator[subprocess.Popen[str]]:
    """One iperf3 server in ``ns`` on ``addr`` for any number of client runs
    (iperf3 serves them one after another); stopped on exit.  Returns once
    the server listens, instead of sleeping a fixed time."""
    srv = subprocess.Popen(["ip", "netns", "exec", ns, "iperf3", "-s", "-B", addr, "-p", str(IPERF_PORT)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + timeout
        while True:
            out = subprocess.run(["ip", "netns", "exec", ns, "ss", "-Hltn", "src", f"{addr}:{IPERF_PORT}"],
                                 capture_output=True, text=True).stdout
            if "LISTEN" in out:
                break
            if srv.poll() is not None:
                raise RuntimeError(f"iperf3 server on {addr} in {ns} did not start: {srv.stderr.read()[-300:] if srv.stderr else ''}")
            if time.monotonic() > end:
                raise RuntimeError(f"iperf3 server on {addr} in {ns}: not listening after {timeout:g} s")
            time.sleep(0.1)
        yield srv
    finally:
        srv.terminate()
        try:
            srv.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.communicate()


def iperf_client(client_ns: str, addr: str, seconds: int, streams: int = 1,
                 reverse: bool = False) -> dict[str, Any]:
    """One iperf3 TCP run from ``client_ns`` to a server on ``addr`` (see iperf_server):
    iperf3's ``end.sum_received``.  A failed run raises RuntimeError with iperf3's own error."""
    args = ["ip", "netns", "exec", client_ns, "iperf3", "-c", addr, "-p", str(IPERF_PORT), "-t", str(seconds),
            "-P", str(streams), "-J"]
    if reverse:
        args.append("-R")
    r = subprocess.run(args, capture_output=True, text=True)
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        raise RuntimeError(f"iperf3 -c {addr}: no JSON (status {r.returncode}): {r.stderr.strip()[-300:]}") from None
    if "error" in doc or "sum_received" not in doc.get("end", {}):
        raise RuntimeError(f"iperf3 -c {addr}: {doc.get('error', 'no end.sum_received in its report')}")
    received: dict[str, Any] = doc["end"]["sum_received"]
    return received


# one TCP transfer of a known size, counted by its receiver until EOF (see transfer)
_TRANSFER = r"""
import socket, sys
role, addr, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if role.startswith("listen"):
    s = socket.create_server((addr, port))
    print("ready", flush=True)
    s.settimeout(60)
    c, _ = s.accept()
else:
    c = socket.create_connection((addr, port), timeout=60)
c.settimeout(60)
if role.endswith("send"):
    buf, left = b"x" * 65536, n
    while left:
        left -= c.send(buf[:left])
    c.shutdown(socket.SHUT_WR)
    c.recv(1)  # the receiver closes once it has read everything
    print(n)
else:
    got = 0
    while b := c.recv(65536):
        got += len(b)
    c.close()
    print(got)
"""


def transfer(server_ns: str, client_ns: str, addr: str, nbytes: int, reverse: bool = False,
             port: int = IPERF_PORT + 1, timeout: float = 120) -> int:
    """Bytes that reached the receiver of one TCP transfer of ``nbytes``, client
    in ``client_ns`` to a server on ``addr`` in ``server_ns`` (``reverse``: the
    server sends).  The receiver counts until the sender's EOF, so a completed
    transfer gives ``nbytes`` exactly; iperf3 -n counts only up to the moment
    the sender has written its last byte, with megabytes still in flight on a
    slow link.  A stalled or broken transfer raises RuntimeError."""
    roles = ("listen-send", "connect-recv") if reverse else ("listen-recv", "connect-send")
    srv = subprocess.Popen(["ip", "netns", "exec", server_ns, sys.executable, "-c", _TRANSFER, roles[0], addr,
                            str(port), str(nbytes)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert srv.stdout is not None
        if srv.stdout.readline().strip() != "ready":
            raise RuntimeError(f"transfer server on {addr} in {server_ns}: {srv.communicate(timeout=10)[1][-300:]}")
        cli = subprocess.run(["ip", "netns", "exec", client_ns, sys.executable, "-c", _TRANSFER, roles[1], addr,
                              str(port), str(nbytes)], capture_output=True, text=True, timeout=timeout)
        out, err = srv.communicate(timeout=timeout)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.communicate()
    if cli.returncode or srv.returncode:
        raise RuntimeError(f"transfer to {addr}: client {cli.returncode} {cli.stderr.strip()[-300:]}, "
                           f"server {srv.returncode} {err.strip()[-300:]}")
    return int((cli.stdout if reverse else out).strip())


@contextlib.contextmanager
def journal_copy(log: Path, *idents: str) -> Iterator[None]:
    """journald is the syslog (a systemd guest, Debian's default install):
    copy what ``idents`` write from now on to ``log``, the file the lab's
    own waits read.  The daemon reads the journal itself (``Lab.lns_log_source``)."""
    if not os.path.exists("/run/systemd/journal/socket"):
        raise RuntimeError("no journald here (/run/systemd/journal/socket): boot the guest with --init systemd")
    out = open(log, "ab")
    p = subprocess.Popen(["journalctl", "-f", "-n", "0", "-o", "short-precise",
                          *(a for i in idents for a in ("-t", i))], stdout=out, stderr=subprocess.STDOUT)
    out.close()
    try:
        time.sleep(1)  # following before the first line it must copy
        yield
    finally:
        p.terminate()
        p.wait(10)


# Debian's rsyslog, reduced to what writes xl2tpd's lines to a file: its
# socket, and the traditional file format Debian's rsyslog.conf sets
RSYSLOG_CONF = """module(load="imuxsock" SysSock.Name="/dev/log")
global(workDirectory="{work}")
*.* action(type="omfile" file="{log}" template="RSYSLOG_TraditionalFileFormat")
"""


@contextlib.contextmanager
def syslogd(kind: str, log: Path) -> Iterator[None]:
    """A syslog daemon on /dev/log writing ``log``: Debian's rsyslog, or
    busybox syslogd (small systems); each reads that one socket in order.
    An xl2tpd started with ``-l`` (``Lab.lns_args``) logs through it, and so
    does every pppd.  /dev/log is gone again after, so later daemons find no
    syslog socket to send barriers to."""
    if kind == "rsyslog":
        work = log.parent / "rsyslog"
        work.mkdir()
        conf = work / "rsyslog.conf"
        conf.write_text(RSYSLOG_CONF.format(work=work, log=log))
        p = subprocess.Popen(["rsyslogd", "-n", "-f", str(conf), "-i", str(work / "pid")])
    else:
        p = subprocess.Popen(["busybox", "syslogd", "-n", "-O", str(log)])
    try:
        end = time.monotonic() + 10
        while not os.path.exists("/dev/log"):
            if time.monotonic() > end or p.poll() is not None:
                raise RuntimeError(f"{kind}: no /dev/log in 10 s (exit status {p.poll()})")
            time.sleep(0.05)
        yield
    finally:
        p.terminate()
        p.wait(10)
        with contextlib.suppress(FileNotFoundError):
            os.unlink("/dev/log")
