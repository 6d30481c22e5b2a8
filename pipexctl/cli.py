"""The `pipexctl` command: parse, call the library, render.

Exit codes: 0 ok, 1 operational error (one line on stderr), 2 usage error.
"""

from __future__ import annotations

import faulthandler
import ipaddress
import json
import logging
import resource
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

import click

from . import __version__, defaults, errors
from .kernel.backend import KernelBackend, NetlinkBackend, PPPChannel
from .model import Encap, Endpoint, PwType, Session, SessionSpec, TunnelSpec
from .orchestrator import Orchestrator, meta_bytes
from .records import Invalid, dump

# A command's own modules (discovery, the daemon and its client, the kernel probes, the
# PPPoL2TP socket, pppd's options files) are imported inside it: `pipexctl` starts on what
# every command needs, and `pipexctl serve` loads no other command's code (its memory target)

if TYPE_CHECKING:
    from .discovery.discovery import Discovery

# a command function, through the option decorators unchanged
F = TypeVar("F", bound=Callable[..., Any])
# a spec record, built by _spec
M = TypeVar("M")

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class AppContext:
    """What commands share; tests pass one with a NullBackend via ``obj=``."""

    def __init__(self, backend_factory: Optional[Callable[[], KernelBackend]] = None, netns: Optional[str] = None) -> None:
        self._factory = backend_factory
        self.netns = netns
        self._orch: Optional[Orchestrator] = None

    @property
    def orch(self) -> Orchestrator:
        if self._orch is None:
            if self._factory is None:
                self._factory = lambda: NetlinkBackend(netns=self.netns)
            self._orch = Orchestrator(self._factory())
        return self._orch

    def close(self) -> None:
        if self._orch is not None:
            self._orch.backend.close()


class Boundary(click.Group):
    """Library errors become one clear line and an exit code, here only,
    for every command of the group."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except errors.PipexError as e:
            click.echo(f"pipexctl: error: {e}", err=True)
            sys.exit(e.exit_code)
        except Invalid as e:
            click.echo(f"pipexctl: error: {e}", err=True)
            sys.exit(2)


def _spec(cls: type[M], **kw: Any) -> M:
    try:
        return cls(**kw)
    except Invalid as e:
        raise errors.InvalidArgumentError(str(e)) from None


def _endpoint(text: Optional[str], what: str) -> Optional[Endpoint]:
    if text is None:
        return None
    try:
        return Endpoint.parse(text)
    except ValueError as e:
        raise errors.InvalidArgumentError(f"{what}: {e}") from None


def _emit_json(data: object) -> None:
    click.echo(json.dumps(data, indent=None, default=str))


def _table(rows: list[list[Any]], header: list[str]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for r in [header] + rows:
        click.echo("  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip())


@click.group(cls=Boundary, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "-V", "--version", prog_name="pipexctl")
@click.option("-n", "--netns", metavar="NAME", help="Work in network namespace NAME (as `ip -n NAME`).")
@click.pass_context
def cli(ctx: click.Context, netns: Optional[str]) -> None:
    """Offload L2TP/PPP sessions to the Linux kernel.

    \b
    Examples:
      pipexctl check
      pipexctl addsess l2tp --version 3 --pw eth --tunnel-id 100 --peer-tunnel-id 200 \\
          --session-id 10 --peer-session-id 20 --local 10.98.0.1:5000 --remote 10.98.0.2:5001
      pipexctl showsess --json
    """
    if ctx.obj is None:
        ctx.obj = AppContext(netns=netns)
    elif netns is not None:
        ctx.obj.netns = netns
    ctx.call_on_close(ctx.obj.close)


# ---------------------------------------------------------------- tunnels

id_type = click.IntRange(min=0, max=0xFFFFFFFF)


def tunnel_options(fn: F) -> F:
    for dec in reversed(
        [
            click.option("--tunnel-id", type=id_type, required=True, help="Our tunnel id."),
            click.option("--peer-tunnel-id", type=id_type, required=True, help="The peer's tunnel id."),
            click.option("--version", "l2tp_version", type=click.Choice(["2", "3"]), default="3", show_default=True, help="L2TP version."),
            click.option("--encap", type=click.Choice(["udp", "ip"]), default="udp", show_default=True, help="Encapsulation (ip: L2TPv3 only)."),
            click.option("--local", help="Local ADDR[:PORT] (IPv6: [ADDR]:PORT)."),
            click.option("--remote", help="Peer ADDR[:PORT]."),
            click.option("--udp-csum/--no-udp-csum", default=None, help="IPv4 UDP checksums (kernel default: off)."),
            click.option("--udp6-zero-csum-tx", is_flag=True, help="IPv6: send zero UDP checksums."),
            click.option("--udp6-zero-csum-rx", is_flag=True, help="IPv6: accept zero UDP checksums."),
        ]
    ):
        fn = dec(fn)
    return fn


def _tunnel_spec(tunnel_id: int, peer_tunnel_id: int, l2tp_version: str, encap: str, local: Optional[str],
                 remote: Optional[str], udp_csum: Optional[bool], udp6_zero_csum_tx: bool,
                 udp6_zero_csum_rx: bool) -> TunnelSpec:
    return _spec(
        TunnelSpec,
        tunnel_id=tunnel_id,
        peer_tunnel_id=peer_tunnel_id,
        version=int(l2tp_version),
        encap=Encap(encap),
        local=_endpoint(local, "--local"),
        remote=_endpoint(remote, "--remote"),
        udp_csum=udp_csum,
        udp6_zero_csum_tx=udp6_zero_csum_tx,
        udp6_zero_csum_rx=udp6_zero_csum_rx,
    )


@cli.command()
@tunnel_options
@click.option("--json", "as_json", is_flag=True, help="Print the created tunnel as JSON.")
@click.pass_obj
def addtun(app: AppContext, /, as_json: bool, **kw: Any) -> None:  # app: pass_obj's, positional (kw names none)
    """Create an unmanaged kernel tunnel (the kernel opens its own socket).

    \b
    Example:
      pipexctl addtun --tunnel-id 100 --peer-tunnel-id 200 --local 10.98.0.1:5000 --remote 10.98.0.2:5001
    """
    t = app.orch.add_tunnel(_tunnel_spec(**kw))
    if as_json:
        _emit_json(dump(t))
    else:
        click.echo(f"tunnel {t.tunnel_id} created (peer {t.peer_tunnel_id}, L2TPv{t.version}/{t.encap.value})")


@cli.command()
@click.option("--tunnel-id", type=id_type, required=True, help="The tunnel to delete (and all its sessions).")
@click.pass_obj
def deltun(app: AppContext, tunnel_id: int) -> None:
    """Delete a tunnel and every session in it.

    \b
    Example:
      pipexctl deltun --tunnel-id 100
    """
    app.orch.delete_tunnel(tunnel_id)
    click.echo(f"tunnel {tunnel_id} deleted")


@cli.command()
@click.option("--tunnel-id", type=id_type, help="Only this tunnel.")
@click.option("--json", "as_json", is_flag=True, help="JSON, one array (like `ip -j`).")
@click.pass_obj
def showtun(app: AppContext, tunnel_id: Optional[int], as_json: bool) -> None:
    """List kernel tunnels.

    \b
    Example:
      pipexctl showtun --json
    """
    tunnels = app.orch.tunnels()
    if tunnel_id is not None:
        tunnels = [t for t in tunnels if t.tunnel_id == tunnel_id]
        if not tunnels:
            raise errors.NotFoundError(f"tunnel {tunnel_id} does not exist")
    if as_json:
        _emit_json([dump(t) for t in tunnels])
        return
    rows = [
        [t.tunnel_id, t.peer_tunnel_id, f"v{t.version}", t.encap.value, t.local or "-", t.remote or "-"]
        for t in tunnels
    ]
    _table(rows, ["TUNNEL", "PEER", "VER", "ENCAP", "LOCAL", "REMOTE"])


# ---------------------------------------------------------------- sessions

OPENBSD_ORDER = (
    "sess-id",
    "peer-sess-id",
    "src-addr",
    "framed-addr",
    "framed-netmask",
    "local-addr:port",
    "peer-addr:port",
    "tun-id",
    "peer-tun-id",
)


def _int_arg(value: str, name: str) -> int:
    try:
        v = int(value, 0)
    except ValueError:
        raise errors.InvalidArgumentError(f"{name}: {value!r} is not a number") from None
    return v


def _ip_arg(value: str, name: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise errors.InvalidArgumentError(f"{name}: {value!r} is not an IP address") from None


@cli.command(context_settings={"ignore_unknown_options": False})
@click.argument("args", nargs=-1, metavar="[l2tp] [SESS-ID PEER-SESS-ID SRC-ADDR FRAMED-ADDR FRAMED-NETMASK LOCAL-ADDR:PORT PEER-ADDR:PORT TUN-ID PEER-TUN-ID]")
@click.option("--tunnel-id", type=id_type, help="Our tunnel id.")
@click.option("--peer-tunnel-id", type=id_type, help="Peer tunnel id (creates the tunnel when missing).")
@click.option("--session-id", type=id_type, help="Our session id.")
@click.option("--peer-session-id", type=id_type, help="The peer's session id.")
@click.option("--local", help="Local ADDR:PORT of the tunnel (creates it when missing).")
@click.option("--remote", help="Peer ADDR:PORT of the tunnel.")
@click.option("--encap", type=click.Choice(["udp", "ip"]), default="udp", show_default=True)
@click.option("--version", "l2tp_version", type=click.Choice(["2", "3"]), help="L2TP version [default: 2 with --pw ppp, else 3].")
@click.option("--pw", type=click.Choice(["eth", "ppp"]), help="Pseudowire [default: ppp with --version 2, else eth].")
@click.option("--ifname", help="Interface name of an eth pseudowire (e.g. pw0).")
@click.option("--cookie", help="L2TPv3 cookie, 8 or 16 hex digits.")
@click.option("--peer-cookie", help="L2TPv3 peer cookie.")
@click.option("--l2spec", type=click.Choice(["none", "default"]), help="L2TPv3 L2-specific sublayer.")
@click.option("--seq/--no-seq", "seq", default=None, help="Send and expect sequence numbers.")
@click.option("--lns-mode", is_flag=True, default=None, help="PPP: act as LNS (controls sequencing).")
@click.option("--udp-csum/--no-udp-csum", default=None, help="IPv4 UDP checksums of a new tunnel.")
@click.option("--fd-to", type=click.Path(dir_okay=False), help="PPP: connect a PPPoL2TP socket and hand its fd to this unix socket (SCM_RIGHTS).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def addsess(app: AppContext, args: tuple[str, ...], tunnel_id: Optional[int], peer_tunnel_id: Optional[int],
            session_id: Optional[int], peer_session_id: Optional[int], local: Optional[str], remote: Optional[str],
            encap: str, l2tp_version: Optional[str], pw: Optional[str], ifname: Optional[str], cookie: Optional[str],
            peer_cookie: Optional[str], l2spec: Optional[str], seq: Optional[bool], lns_mode: Optional[bool],
            udp_csum: Optional[bool], fd_to: Optional[str], as_json: bool) -> None:
    """Create a kernel session (and its tunnel when missing).

    Two forms, see the examples.  The OpenBSD pipexctl order (an L2TPv2 PPP session):

    \b
      pipexctl addsess l2tp SESS-ID PEER-SESS-ID SRC-ADDR FRAMED-ADDR FRAMED-NETMASK \\
                            LOCAL-ADDR:PORT PEER-ADDR:PORT TUN-ID PEER-TUN-ID
      pipexctl addsess l2tp 10 20 10.99.0.1 10.99.1.2 255.255.255.255 10.99.0.1:1701 10.99.0.2:1701 100 200

    SRC-ADDR, FRAMED-ADDR and FRAMED-NETMASK are checked and passed on with the
    fd (--fd-to); on Linux pppd negotiates the PPP addresses itself.

    Example of the long form, a standalone L2TPv3 Ethernet pseudowire:

    \b
      pipexctl addsess l2tp --version 3 --pw eth --encap udp --tunnel-id 100 \\
          --peer-tunnel-id 200 --session-id 10 --peer-session-id 20 \\
          --local 10.98.0.1:5000 --remote 10.98.0.2:5001 --ifname pw0

    A PPP session lives while a PPPoL2TP socket is connected to it; with --fd-to
    the socket is handed to a consumer (pppd plugin) that keeps it.
    """
    if args and args[0] == "l2tp":
        args = args[1:]
    framed: dict[str, str] = {}
    if args:
        if len(args) != len(OPENBSD_ORDER):
            raise errors.InvalidArgumentError(
                f"the positional form takes {len(OPENBSD_ORDER)} values ({' '.join(OPENBSD_ORDER)}), got {len(args)}"
            )
        given = [n for n, v in (("--tunnel-id", tunnel_id), ("--peer-tunnel-id", peer_tunnel_id), ("--session-id", session_id),
                                ("--peer-session-id", peer_session_id), ("--local", local), ("--remote", remote)) if v is not None]
        if given:
            raise errors.InvalidArgumentError(f"give ids and endpoints either positionally or as options, not both ({', '.join(given)})")
        session_id = _int_arg(args[0], "sess-id")
        peer_session_id = _int_arg(args[1], "peer-sess-id")
        framed = {
            "src_addr": _ip_arg(args[2], "src-addr"),
            "framed_addr": _ip_arg(args[3], "framed-addr"),
            "framed_netmask": _ip_arg(args[4], "framed-netmask"),
        }
        local, remote = args[5], args[6]
        tunnel_id = _int_arg(args[7], "tun-id")
        peer_tunnel_id = _int_arg(args[8], "peer-tun-id")
        pw = pw or "ppp"
    for name, v in (("--tunnel-id", tunnel_id), ("--session-id", session_id), ("--peer-session-id", peer_session_id)):
        if v is None:
            raise errors.InvalidArgumentError(f"missing {name}")
    if pw is None:
        pw = "ppp" if l2tp_version == "2" else "eth"
    version = int(l2tp_version) if l2tp_version else (2 if pw == "ppp" else 3)

    tspec = None
    if peer_tunnel_id is not None or local is not None or remote is not None:
        if peer_tunnel_id is None:
            raise errors.InvalidArgumentError("creating the tunnel needs --peer-tunnel-id")
        assert tunnel_id is not None  # a missing --tunnel-id was refused above
        tspec = _tunnel_spec(tunnel_id, peer_tunnel_id, str(version), encap, local, remote, udp_csum, False, False)
    sspec = _spec(
        SessionSpec,
        tunnel_id=tunnel_id,
        session_id=session_id,
        peer_session_id=peer_session_id,
        version=version,
        pw_type=PwType(pw),
        ifname=ifname,
        cookie=cookie,
        peer_cookie=peer_cookie,
        l2spec_type=None if l2spec is None else (1 if l2spec == "default" else 0),
        recv_seq=seq,
        send_seq=seq,
        lns_mode=lns_mode,
    )
    if fd_to and pw != "ppp":
        raise errors.InvalidArgumentError("--fd-to hands over a PPPoL2TP socket: it needs --pw ppp")

    def hand_off(channel: PPPChannel, meta: dict[str, int]) -> None:
        from .kernel.pppol2tp import send_fd

        assert fd_to is not None  # handed to add_session only with --fd-to
        send_fd(fd_to, channel.fileno(), meta_bytes({**meta, **framed}))

    r = app.orch.add_session(sspec, tspec, connect_ppp=bool(fd_to), hand_off=hand_off if fd_to else None)
    if as_json:
        _emit_json(
            {
                "tunnel": dump(r.tunnel),
                "session": dump(r.session),
                "tunnel_created": r.tunnel_created,
                "channel": r.channel,
                **framed,
            }
        )
        return
    what = f"session {r.session.session_id} in tunnel {r.tunnel.tunnel_id} created"
    extra = []
    if r.tunnel_created:
        extra.append(f"tunnel {r.tunnel.tunnel_id} created")
    if r.session.ifname:
        extra.append(f"interface {r.session.ifname}")
    if r.channel is not None:
        extra.append(f"PPP channel {r.channel} handed to {fd_to}")
    click.echo(what + (f" ({', '.join(extra)})" if extra else ""))


@cli.command()
@click.argument("proto", required=False, type=click.Choice(["l2tp"]))
@click.option("--tunnel-id", type=id_type, required=True)
@click.option("--session-id", type=id_type, required=True)
@click.option("--tunnel-too", is_flag=True, help="Also delete the tunnel once it has no session left.")
@click.pass_obj
def delsess(app: AppContext, proto: Optional[str], tunnel_id: int, session_id: int, tunnel_too: bool) -> None:
    """Delete a kernel session.

    \b
    Example:
      pipexctl delsess l2tp --tunnel-id 100 --session-id 10
    """
    gone = app.orch.delete_session(tunnel_id, session_id, tunnel_too=tunnel_too)
    click.echo(f"session {session_id} in tunnel {tunnel_id} deleted" + (f"; tunnel {tunnel_id} deleted" if gone else ""))


def _session_rows(sessions: list[Session]) -> list[list[Any]]:
    return [
        [s.tunnel_id, s.session_id, s.peer_tunnel_id if s.peer_tunnel_id is not None else "-", s.peer_session_id,
         s.pw_type.value, s.ifname or "-"]
        for s in sessions
    ]


@cli.command()
@click.option("--tunnel-id", type=id_type, help="Only sessions of this tunnel.")
@click.option("--json", "as_json", is_flag=True, help="JSON, one array (like `ip -j`).")
@click.pass_obj
def showsess(app: AppContext, tunnel_id: Optional[int], as_json: bool) -> None:
    """List kernel sessions.

    \b
    Example:
      pipexctl showsess --tunnel-id 100
    """
    sessions = app.orch.sessions(tunnel_id)
    if as_json:
        _emit_json([dump(s) for s in sessions])
        return
    _table(_session_rows(sessions), ["TUNNEL", "SESSION", "PEER-TUNNEL", "PEER-SESSION", "PW", "IFNAME"])


@cli.command()
@click.option("--socket", "socket_path", default=defaults.SERVE_SOCKET, show_default=True,
              help="The daemon's socket.")
@click.option("--json", "as_json", is_flag=True, help="The daemon's whole status reply.")
def status(socket_path: str, as_json: bool) -> None:
    """Overview of `pipexctl serve`: xl2tpd instances, every call and its data path.

    A call is "offloaded" (this daemon's kernel channel; "offloaded
    (moved)" when its plugin moved it from the pty while it ran), "xl2tpd
    kernel mode", or "pty"; SINCE is when an offloaded call's data path
    became the kernel, or when a call moved back to its pty did so; for a
    pppd that stayed on its pty, the daemon's reason.

    \b
    Example:
      pipexctl status
    """
    from .offload.client import ask

    st = ask(socket_path, {"op": "status"})
    st.pop("ok", None)
    if as_json:
        _emit_json(st)
        return
    for i in st.get("instances", []):
        click.echo(f"xl2tpd {i['instance']}: pid {i['pid'] or '?'}, {i['mode']} mode")
    s = st["stats"]
    click.echo(f"offloads: {s['offloaded']} made ({s['moved']} moved from their pty while running), "
               f"{s['removed']} ended, {s['refused']} refused, {s['failed']} failed, "
               f"{s['adopted']} adopted at restarts")
    doubtful = [(s.get(k, 0), what) for k, what in (
        ("unchecked_calls", "not checked against xl2tpd's control pipe (it did not answer)"),
        ("unbarriered_calls", "read from a log without the daemon's barrier line"),
        ("disputed_calls", "named by two log lines (one forged)"))]
    if any(n for n, _ in doubtful):
        click.echo("log trust: " + "; ".join(f"{n} call(s) {what}" for n, what in doubtful if n))
    rows = [[c["instance"], c["role"], c["tunnel_id"] or "?", c["call_id"], c["peer"], c["pppd_pid"] or "?",
             c["path"] + (" (moved)" if c.get("moved") else ""),
             time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c["since"])) if c.get("since") else "",
             c["why_not"] or ""] for c in st.get("calls", [])]
    _table(rows, ["XL2TPD", "ROLE", "TUNNEL", "CALL", "PEER", "PPPD", "PATH", "SINCE", "WHY-NOT"])


@cli.command()
@click.option("--tunnel-id", type=id_type, help="Only this tunnel.")
@click.option("--session-id", type=id_type, help="Only this session (with --tunnel-id).")
@click.option("--serve", "from_serve", is_flag=True,
              help="The numbers of `pipexctl serve` (the same as its --metrics): calls, offloads by outcome "
                   "and reason, reconciles, and the counters of the sessions it offloaded.")
@click.option("--socket", "socket_path", default=defaults.SERVE_SOCKET, show_default=True,
              help="The daemon's socket (with --serve).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def stat(app: AppContext, tunnel_id: Optional[int], session_id: Optional[int], from_serve: bool, socket_path: str,
         as_json: bool) -> None:
    """Per-session counters (netlink SESSION_GET statistics).

    \b
    Examples:
      pipexctl stat --tunnel-id 100 --session-id 10 --json
      pipexctl stat --serve --json
    """
    if from_serve:
        from .offload.client import ask

        m = ask(socket_path, {"op": "metrics"})
        m.pop("ok", None)
        m["sessions"] = [s for s in m["sessions"]
                         if tunnel_id in (None, s["tunnel_id"]) and session_id in (None, s["session_id"])]
        if as_json:
            _emit_json(m)
            return
        o = m["offload"]
        click.echo(f"offloaded: {m['offloaded_sessions']} session(s) in {m['offloaded_tunnels']} tunnel(s); "
                   f"{o['offloaded']} offloads, {o['removed']} removed, "
                   f"refused {sum(o['refused'].values())} {o['refused'] or ''}, "
                   f"failed {sum(o['failed'].values())} {o['failed'] or ''}".rstrip())
        click.echo("calls: " + (", ".join(f"{c['count']} {c['role']}/{c['data_path']}" for c in m["calls"]) or "none"))
        r = m["reconcile"]
        click.echo(f"reconcile: {r['runs']} run(s), {r['adopted']} adopted, {r['orphans_removed']} orphans removed")
        rows = [[s["tunnel_id"], s["session_id"], s["peer"], s["rx_packets"], s["rx_bytes"], s["rx_errors"],
                 s["tx_packets"], s["tx_bytes"], s["tx_errors"]] for s in m["sessions"]]
        _table(rows, ["TUNNEL", "SESSION", "PEER", "RX-PKTS", "RX-BYTES", "RX-ERR", "TX-PKTS", "TX-BYTES", "TX-ERR"])
        return
    if session_id is not None:
        if tunnel_id is None:
            raise errors.InvalidArgumentError("--session-id needs --tunnel-id")
        sessions = [app.orch.session(tunnel_id, session_id)]
    else:
        sessions = app.orch.sessions(tunnel_id)
    if as_json:
        _emit_json([{"tunnel_id": s.tunnel_id, "session_id": s.session_id, **dump(s.stats)} for s in sessions])
        return
    rows = [
        [s.tunnel_id, s.session_id, s.stats.rx_packets, s.stats.rx_bytes, s.stats.rx_errors,
         s.stats.tx_packets, s.stats.tx_bytes, s.stats.tx_errors]
        for s in sessions
    ]
    _table(rows, ["TUNNEL", "SESSION", "RX-PKTS", "RX-BYTES", "RX-ERR", "TX-PKTS", "TX-BYTES", "TX-ERR"])


@cli.command()
@click.option("--offload", "offload_setup", is_flag=True,
              help="Also the offload's set-up: the plugin for the running pppd, the daemon, xl2tpd's options "
                   "files and modes (warnings only).")
@click.option("--xl2tpd-conf", default="/etc/xl2tpd/xl2tpd.conf", show_default=True, help="With --offload.")
@click.option("--socket", "socket_path", default=defaults.SERVE_SOCKET, show_default=True,
              help="With --offload: the daemon's socket.")
@click.option("--json", "as_json", is_flag=True)
def check(offload_setup: bool, xl2tpd_conf: str, socket_path: str, as_json: bool) -> None:
    """Report kernel support: modules, genl family, PPPoL2TP, /dev/ppp, nftables.

    Exits 1 when something required is missing.

    \b
    Examples:
      pipexctl check
      pipexctl check --offload
    """
    from .kernel.check import as_dicts, run_checks

    checks = run_checks()
    if offload_setup:
        from .offload.setupcheck import offload_checks

        checks += offload_checks(xl2tpd_conf, socket_path)
    if as_json:
        _emit_json(as_dicts(checks))
    else:
        for c in checks:
            mark = "ok  " if c.ok else ("FAIL" if c.required else "warn")
            click.echo(f"{mark}  {c.name:22} {c.detail}")
    if any(c.required and not c.ok for c in checks):
        sys.exit(1)


# ---------------------------------------------------------------- discovery


def discovery_options(fn: F) -> F:
    for dec in reversed([
        click.option("--log", "logs", multiple=True, metavar="PATH|journal:UNIT|journal-id:IDENT",
                     help="xl2tpd log to read: a file (plain or syslog), or the journal. Repeatable. "
                          "[default: the first of /var/log/syslog, /var/log/daemon.log that exists, else "
                          "journal:xl2tpd (this boot): one source, so no xl2tpd is read twice]"),
        click.option("--control", "controls", multiple=True, metavar="PIPE",
                     help="xl2tpd control pipe, paired with the --log at the same position. Repeatable. "
                          "[default: /var/run/xl2tpd/l2tp-control when it exists]"),
        click.option("--no-proc", is_flag=True, help="Do not look at /proc for pppd processes."),
        click.option("--no-kernel", is_flag=True, help="Do not ask the kernel which calls it carries."),
        click.option("--identifier", default="xl2tpd", show_default=True, help="Syslog identifier of xl2tpd."),
    ]):
        fn = dec(fn)
    return fn


def _discovery(app: "AppContext", logs: tuple[str, ...], controls: tuple[str, ...], no_proc: bool, no_kernel: bool,
               identifier: str, follow: bool, barrier_socket: Optional[str] = None) -> Discovery:
    from .discovery.discovery import Discovery, default_sources

    found_logs, found_controls = default_sources()
    logs = logs or tuple(found_logs)
    controls = controls or tuple(found_controls)
    if not logs and not controls:
        raise errors.PipexError("no xl2tpd log or control pipe found: give --log and/or --control")
    return Discovery(list(logs), list(controls), proc=not no_proc, kernel=not no_kernel, netns=app.netns,
                     identifier=identifier, follow=follow, barrier_socket=barrier_socket)


def _age(since: float) -> str:
    s = max(0, int(time.time() - since))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")


def _served_paths(socket_path: str) -> dict[tuple[Optional[int], int, str], dict[str, Any]]:
    """Each call's path and since-when as `pipexctl serve` knows them, by
    (tunnel, call, peer): the daemon names xl2tpd instances after its own
    --log arguments, which need not be spelt as discover's.  {} when no
    daemon answers there (discover needs none)."""
    from .offload.client import ask

    try:
        st = ask(socket_path, {"op": "status"}, timeout=5)
    except errors.PipexError:
        return {}
    return {(c["tunnel_id"], c["call_id"], c["peer"]): c for c in st.get("calls", [])}


@cli.command()
@discovery_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object: tunnels, calls, stats.")
@click.option("--socket", "socket_path", default=defaults.SERVE_SOCKET, show_default=True,
              help="Where `pipexctl serve` listens: if it answers, each call's PATH-SINCE comes from it.")
@click.pass_obj
def discover(app: AppContext, logs: tuple[str, ...], controls: tuple[str, ...], no_proc: bool, no_kernel: bool,
             identifier: str, as_json: bool, socket_path: str) -> None:
    """List every tunnel and call of running xl2tpd instances.

    Sources are merged: the logs give ids and history, the control pipe what
    xl2tpd holds now, /proc the pppd PIDs and their data path (pty or
    PPPoL2TP), the kernel which calls it already carries.  When `pipexctl
    serve` answers on --socket, PATH-SINCE says since when each call is on
    its path: the offload, or a live move either way (it is empty for a
    call whose path has not changed while the daemon ran).

    \b
    Example:
      pipexctl discover --log /var/log/syslog --control /var/run/xl2tpd/l2tp-control
      pipexctl -n lns discover --log /tmp/xl2tpd.log --json
    """
    d = _discovery(app, logs, controls, no_proc, no_kernel, identifier, follow=False)
    try:
        snap = d.snapshot()
    finally:
        d.close()
    served = _served_paths(socket_path)
    for c in snap.calls:
        known = served.get((c.tunnel_id, c.call_id, c.peer))
        if known is not None and known.get("since"):
            c.path_changed = known["since"]
    if as_json:
        _emit_json(snap.as_dict())
        return
    rows = [[c.role, c.section or "-", f"{c.peer}:{c.peer_port}" if c.peer_port else c.peer,
             f"{c.tunnel_id if c.tunnel_id is not None else '?'}/{c.peer_tunnel_id if c.peer_tunnel_id is not None else '?'}",
             f"{c.call_id}/{c.peer_call_id if c.peer_call_id is not None else '?'}",
             c.pppd_pid or "-", c.data_path,
             time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c.path_changed)) if c.path_changed else "",
             _age(c.since)] for c in snap.calls]
    _table(rows, ["ROLE", "SECTION", "PEER", "TUNNEL(OUR/PEER)", "CALL(OUR/PEER)", "PPPD", "DATA-PATH",
                  "PATH-SINCE", "AGE"])
    idle = [t for t in snap.tunnels if not any(c.tunnel_id == t.tunnel_id and c.instance == t.instance for c in snap.calls)]
    for t in idle:
        click.echo(f"tunnel {t.tunnel_id}/{t.peer_tunnel_id} to {t.peer} ({t.role}) has no call")
    for w in snap.stats["warnings"]:
        click.echo(f"warning: {w}", err=True)
    if snap.stats["malformed"]:
        click.echo(f"warning: {snap.stats['malformed']} malformed xl2tpd log lines ignored", err=True)


@cli.command()
@discovery_options
@click.option("--json", "as_json", is_flag=True, help="Newline-delimited JSON, one object per event.")
@click.option("--duration", type=float, help="Stop after this many seconds.")
@click.pass_obj
def watch(app: AppContext, logs: tuple[str, ...], controls: tuple[str, ...], no_proc: bool, no_kernel: bool,
          identifier: str, as_json: bool, duration: Optional[float]) -> None:
    """Follow xl2tpd: print each tunnel/call event once, in order.

    First the objects alive now (TunnelUp, CallUp), then TunnelUp, CallUp,
    CallUpdated, DataPathChanged, CallDown and TunnelDown as they happen.

    \b
    Example:
      pipexctl watch --json --log /var/log/syslog
      xl2tpd -D 2>&1 | tee /tmp/x.log  &  pipexctl watch --log /tmp/x.log
    """
    from .discovery.state import DataPathChanged, TunnelDown, TunnelUp

    d = _discovery(app, logs, controls, no_proc, no_kernel, identifier, follow=True)
    until = time.monotonic() + duration if duration else None
    try:
        for e in d.events(until=until):
            if as_json:
                doc = e.dump()
                if "call" in doc:
                    del doc["call"]["pppd_argv"]
                click.echo(json.dumps(doc, separators=(",", ":"), ensure_ascii=False))  # as pydantic's dump wrote it
            else:
                if isinstance(e, (TunnelUp, TunnelDown)):
                    t = e.tunnel
                    what = f"tunnel {t.tunnel_id}/{t.peer_tunnel_id} {t.role} {t.peer}"
                else:
                    c = e.call
                    what = (f"call {c.call_id}/{c.peer_call_id} tunnel {c.tunnel_id}/{c.peer_tunnel_id} "
                            f"pppd {c.pppd_pid or '-'} {c.data_path}")
                extra = getattr(e, "reason", "") or ""
                if isinstance(e, DataPathChanged):
                    extra = f"{e.old} -> {e.new}"
                click.echo(f"{e.event:16} {what}" + (f" ({extra})" if extra else ""))
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass
    finally:
        d.close()


# ---------------------------------------------------------------- offload


def _check_listen(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[str]:
    if value is None:
        return None
    from .offload.metrics import parse_listen

    try:
        parse_listen(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    return value


@cli.command()
@discovery_options
@click.option("--socket", "socket_path", default=defaults.SERVE_SOCKET, show_default=True,
              help="Unix socket the pppd plugin connects to (0600, in a 0700 directory).")
@click.option("--wait", default=defaults.REQUEST_WAIT, show_default=True,
              help="Seconds to wait for a pppd's call to show in discovery.")
@click.option("--xl2tpd-port", default=defaults.L2TP_PORT, show_default=True, help="UDP port xl2tpd listens on.")
@click.option("--reconcile-interval", default=defaults.RECONCILE_INTERVAL, show_default=True,
              help="Seconds between /proc and kernel checks while calls come and go (at least 30 s while "
                   "nothing happens, and never more than a tenth of a CPU: a check that took 2 s of CPU waits "
                   "20 s). Logs are read every second, every 0.05 s while a pppd waits for its call.")
@click.option("--state", "state_path", default=None, metavar="PATH",
              help="State file of what the daemon made  [default: state.json next to --socket]")
@click.option("--teardown-on-exit", is_flag=True,
              help="On SIGTERM remove every offloaded session (default: leave them running for the next start).")
@click.option("--metrics", "metrics_listen", default=None, metavar="[HOST]:PORT", callback=_check_listen,
              help="Serve Prometheus metrics on http://HOST:PORT/metrics (':PORT': 127.0.0.1 only; "
                   "they name subscribers' addresses: give 0.0.0.0 or [::] to serve every address).")
@click.option("--metrics-max-sessions", default=1000, show_default=True, type=click.IntRange(0),
              help="Per-session counter series at most; the rest are summed.")
@click.option("-v", "--verbose", is_flag=True, help="Log each offload and removal to stderr.")
@click.pass_obj
def serve(app: AppContext, logs: tuple[str, ...], controls: tuple[str, ...], no_proc: bool, no_kernel: bool,
          identifier: str, socket_path: str, wait: float, xl2tpd_port: int, reconcile_interval: float,
          state_path: Optional[str], teardown_on_exit: bool, metrics_listen: Optional[str], metrics_max_sessions: int,
          verbose: bool) -> None:
    """Offload userspace-mode xl2tpd calls: hand pppd a kernel channel.

    pppd loads the plugin (`plugin pipexctl.so` in xl2tpd's pppd options file);
    the plugin asks this daemon for its channel; the daemon creates the
    kernel tunnel (on a UDP socket like xl2tpd's kernel mode makes), session
    and PPPoL2TP socket for that call and sends the socket to pppd; what the
    kernel passes up (L2TP control) is relayed to xl2tpd.  Run it in
    xl2tpd's network namespace.

    At start (and on SIGHUP) it reconciles its state file with the kernel
    and discovery: sessions of live calls are adopted, orphans removed.
    SIGTERM leaves offloaded sessions running unless --teardown-on-exit.

    \b
    Example:
      pipexctl serve --log /var/log/xl2tpd.log --control /var/run/xl2tpd/l2tp-control
    """
    from .offload import journal, malloc, sdnotify
    from .offload.datapath import KernelDataPath
    from .offload.server import OffloadServer

    malloc.limit_arenas()  # before any thread: each request thread would get an arena, kept after it ends
    if journal.under_journald():
        # records with fields (TUNNEL_ID, CALL_ID, PEER): `journalctl -u pipexctl TUNNEL_ID=17`
        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                            handlers=[journal.JournalHandler()], format="%(message)s")
    else:
        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                            format="%(asctime)s.%(msecs)03d pipexctl serve: %(message)s", datefmt="%Y-%m-%dT%H:%M:%S")
    _raise_fd_limit()
    d = _discovery(app, logs, controls, no_proc, no_kernel, identifier, follow=True,
                   barrier_socket=defaults.SYSLOG_SOCKET)
    backend = NetlinkBackend(netns=app.netns)
    try:
        datapath = KernelDataPath(xl2tpd_port, netns=app.netns)
    except PermissionError:
        d.close()
        backend.close()
        raise errors.PermissionDeniedError("the control relay needs a raw socket (CAP_NET_RAW)") from None
    srv = OffloadServer(socket_path, d, backend, datapath, wait=wait, xl2tpd_port=xl2tpd_port,
                        reconcile_interval=reconcile_interval, state_path=state_path,
                        teardown_on_exit=teardown_on_exit)
    srv.service.max_session_series = metrics_max_sessions
    srv.activated = sdnotify.listen_socket()  # pipexctl.socket: --socket is then systemd's
    httpd = None
    if metrics_listen:
        from .offload import metrics  # only with --metrics

        try:
            httpd = metrics.start(srv.service, metrics_listen)
        except OSError as e:
            d.close()
            backend.close()
            raise errors.SocketError(f"cannot serve metrics on {metrics_listen}: {e.strerror}") from None
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: srv.stop.set())
    signal.signal(signal.SIGHUP, lambda *_: srv.reload.set())
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stack of every thread to stderr, for bug reports
    try:
        srv.serve_forever()
    finally:
        if httpd is not None:
            httpd.shutdown()
        d.close()
        backend.close()


@cli.group()
def offload() -> None:
    """Turn the offload on or off in xl2tpd's pppd options files; move running calls.

    enable/disable: one marked block per options file (`plugin pipexctl.so`
    and its options); no line outside it is touched, and a file that loads
    pipexctl.so or pppol2tp.so elsewhere is refused. The Ansible module
    `pipexctl.l2tp.offload` does the same through the same functions. Takes
    effect for the next call. move: running calls between pty and kernel.

    \b
    Example:
      pipexctl offload enable --required
    """


def _offload_options(fn: F) -> F:
    for deco in reversed([
        click.option("--xl2tpd-conf", default="/etc/xl2tpd/xl2tpd.conf", show_default=True,
                     help="xl2tpd's configuration: its pppoptfile lines name the options files."),
        click.option("--options", "options_files", multiple=True, metavar="FILE",
                     help="An options file to manage (repeatable) [default: every pppoptfile of --xl2tpd-conf]."),
        click.option("--dry-run", is_flag=True, help="Say what would change; write nothing."),
        click.option("--json", "as_json", is_flag=True, help="The changed files (and their new text) as JSON."),
    ]):
        fn = deco(fn)
    return fn


def _offload_apply(xl2tpd_conf: str, options_files: tuple[str, ...], want: Optional[str], dry_run: bool,
                   as_json: bool) -> None:
    from .offload import pppopts

    files = list(options_files) or pppopts.files_of(xl2tpd_conf)
    changes = pppopts.manage(files, want, write=not dry_run)
    if as_json:
        _emit_json({"files": files, "changed": [c.path for c in changes], "dry_run": dry_run})
        return
    for c in changes:
        click.echo(f"{'would change' if dry_run else 'changed'}: {c.path}")
    if not changes:
        click.echo(f"unchanged: {', '.join(files)}")


@offload.command("enable")
@_offload_options
@click.option("--socket", "socket_path", default=defaults.SERVE_SOCKET, show_default=True,
              help="The daemon's socket (pipexctl_socket).")
@click.option("--required", is_flag=True, help="pppd fails instead of staying on its pty (pipexctl_required).")
@click.option("--timeout", type=click.IntRange(1, 60), help="Seconds pppd waits for the daemon (pipexctl_timeout).")
@click.option("--move", type=click.IntRange(0, 3600), metavar="SECS",
              help="A call left on its pty asks to move into the kernel every SECS seconds; 0: never, "
                   "and no control link, so no call moves back to its pty either (pipexctl_move; the "
                   "plugin's default is 1).")
def offload_enable(xl2tpd_conf: str, options_files: tuple[str, ...], dry_run: bool, as_json: bool, socket_path: str,
                   required: bool, timeout: Optional[int], move: Optional[int]) -> None:
    """Add (or update) the plugin block.

    \b
    Example:
      pipexctl offload enable --dry-run
    """
    from .offload import pppopts

    try:
        want = pppopts.block(socket=socket_path, required=required, timeout=timeout, move=move)
    except ValueError as e:
        raise errors.InvalidArgumentError(str(e)) from None
    _offload_apply(xl2tpd_conf, options_files, want, dry_run, as_json)


@offload.command("disable")
@_offload_options
def offload_disable(xl2tpd_conf: str, options_files: tuple[str, ...], dry_run: bool, as_json: bool) -> None:
    """Remove the plugin block: the next calls stay on their ptys.

    \b
    Example:
      pipexctl offload disable --options /etc/ppp/options.xl2tpd
    """
    _offload_apply(xl2tpd_conf, options_files, None, dry_run, as_json)


@offload.command("move")
@click.option("--call", "call_id", type=id_type, help="The call (our call id, as `pipexctl status` lists it).")
@click.option("--tunnel-id", type=id_type, help="The call's tunnel, where its id is in several.")
@click.option("--all", "all_calls", is_flag=True, help="Every call that can go.")
@click.option("--undo", is_flag=True, help="Back from the kernel to the pty (default: from the pty into the kernel).")
@click.option("--socket", "socket_path", default=defaults.SERVE_SOCKET, show_default=True,
              help="The daemon's socket.")
@click.option("--json", "as_json", is_flag=True, help="The daemon's reply as JSON.")
def offload_move(call_id: Optional[int], tunnel_id: Optional[int], all_calls: bool, undo: bool, socket_path: str,
                 as_json: bool) -> None:
    """Move running calls into the kernel, or back to their pty (--undo).

    Without renegotiation: each call's pppd (pipexctl.so) swaps the channel
    under its ppp unit, over the control link the plugin keeps to `pipexctl
    serve`, whether the call was offloaded at pppd's start or began on its
    pty. Move calls back before stopping the daemon for good: while it
    runs, calls on their ptys are moved in again only when asked (or by a
    new daemon).

    \b
    Examples:
      pipexctl offload move --all --undo
      pipexctl offload move --call 5215
    """
    from .offload.client import ask

    if (call_id is None) == (not all_calls):
        raise click.UsageError("name one call (--call) or --all")
    req: dict[str, Any] = {"op": "path", "to": "pty" if undo else "kernel"}
    req.update({"all": True} if all_calls else {"call": call_id, "tunnel": tunnel_id})
    rep = ask(socket_path, req, timeout=60)
    rep.pop("ok", None)
    if as_json:
        _emit_json(rep)
    else:
        where = "to the pty" if undo else "into the kernel"
        for name in rep["moved"]:
            click.echo(f"moved {where}: call {name}")
        for name, why in sorted(rep["failed"].items()):
            click.echo(f"not moved: call {name}: {why}")
    if rep["failed"]:
        raise errors.PipexError(f"{len(rep['failed'])} call(s) not moved {'to the pty' if undo else 'into the kernel'}")


def _raise_fd_limit() -> None:
    """The soft fd limit up to the hard one: the daemon holds a pty, a pidfd,
    a control link and a share of a tunnel socket per offloaded call (1024
    is ~250 calls)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < 8192:
        logging.getLogger("pipexctl.serve").warning(
            "open files limited to %d: about %d offloaded calls at most (LimitNOFILE=65536 in the unit)",
            hard, hard // 4)


def main() -> None:
    cli(prog_name="pipexctl")


if __name__ == "__main__":
    main()
