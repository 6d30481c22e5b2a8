"""Write docs/pipexctl.8 (the man page) from the CLI's own --help
(tests/unit/test_docs.py checks it is current and that groff reads it cleanly).

    .venv/bin/python scripts/gen_man.py > docs/pipexctl.8
    man -l docs/pipexctl.8
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from click.testing import CliRunner  # noqa: E402

from pipexctl import __version__  # noqa: E402
from pipexctl.cli import cli  # noqa: E402


def esc(line: str) -> str:
    line = line.replace("\\", "\\e").replace("-", "\\-")
    return ("\\&" + line) if line.startswith((".", "'")) else line


def render() -> str:
    r = CliRunner()
    out = [f'.TH PIPEXCTL 8 "" "pipexctl {__version__}" "System Administration"',
           ".SH NAME", "pipexctl \\- offload xl2tpd/pppd L2TP sessions to the Linux kernel",
           ".SH SYNOPSIS", ".B pipexctl", "[\\fB\\-n\\fR \\fINETNS\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR]",
           ".SH DESCRIPTION",
           "pipexctl creates kernel L2TP tunnels and sessions through the \\fBl2tp\\fR generic\\-netlink family,",
           "learns the ids of a running \\fBxl2tpd\\fR(8)'s tunnels and calls, and with \\fBpipexctl serve\\fR",
           "and its pppd plugin (\\fBpipexctl.so\\fR) moves the PPP data of userspace\\-mode xl2tpd calls from",
           "the pty into the kernel (PPPoL2TP sockets), like OpenBSD's \\fBpipex\\fR(4).",
           ".SH COMMANDS"]
    for name in sorted(cli.commands):
        text = r.invoke(cli, [name, "--help"], prog_name="pipexctl", terminal_width=100).output.rstrip()
        out += [".SS " + esc(f"pipexctl {name}"), ".nf"] + [esc(ln) for ln in text.splitlines()] + [".fi"]
    out += [".SH PLUGIN OPTIONS",
            "pppd options of \\fBpipexctl.so\\fR (\\fBplugin pipexctl.so\\fR in xl2tpd's pppd options file).",
            "All are privileged: they count only from root's command line and options files.",
            ".TP", "\\fBpipexctl_socket\\fR \\fIPATH\\fR", "The daemon's socket (default /run/pipexctl/serve.sock).",
            ".TP", "\\fBpipexctl_timeout\\fR \\fISECS\\fR",
            "How long pppd waits for the daemon, connect and answer, 1 to 60 (default 5).",
            ".TP", "\\fBpipexctl_required\\fR",
            "Stop pppd when no kernel channel can be had (no daemon, a refusal, a kernel without PPPoL2TP)",
            "instead of staying on the pty.",
            ".TP", "\\fBpipexctl_compression\\fR",
            "Keep ACFC/PFC, VJ and CCP compression on the kernel channel (off by default, as pppd's pppol2tp.so does).",
            ".TP", "\\fBpipexctl_move\\fR \\fISECS\\fR",
            "A call that fell back to its pty asks the daemon every SECS seconds to move it into the kernel",
            "while it runs, with no renegotiation; after a refusal it asks less often (default 1, 0 never,",
            "at most 3600).  Every call keeps a control link to the daemon (none with 0), over which",
            "\\fBpipexctl offload move \\-\\-undo\\fR moves it back to its pty, however it began.",
            ".SH SIGNALS", "For \\fBpipexctl serve\\fR:",
            ".TP", "SIGTERM, SIGINT", "Stop; offloaded calls keep running in the kernel and the next start adopts them",
            "(\\fB\\-\\-teardown\\-on\\-exit\\fR removes them instead).",
            ".TP", "SIGHUP", "Ask xl2tpd (control pipe), /proc and the kernel now and reconcile the state file.",
            ".TP", "SIGUSR1", "Write every thread's stack to stderr.",
            ".SH ENVIRONMENT",
            ".TP", "LISTEN_PID, LISTEN_FDS", "Socket activation: the listening socket as fd 3 (pipexctl.socket).",
            ".TP", "NOTIFY_SOCKET, WATCHDOG_USEC", "Readiness, status and watchdog notifications (Type=notify).",
            ".TP", "JOURNAL_STREAM", "Under journald, records are written with fields (TUNNEL_ID, CALL_ID, PEER).",
            ".TP", "RUNTIME_DIRECTORY", "Where control\\-pipe reply FIFOs are made (else the temporary directory); "
            "\\fBserve\\fR removes there, at start, the reply directories of daemons no longer running.",
            ".TP", "PIPEXCTL_OPTS", "The unit's \\fBpipexctl serve\\fR options, from /etc/default/pipexctl.",
            ".SH EXIT STATUS", "0 success; 1 an operational error (one line on stderr); 2 a usage error.",
            ".SH FILES",
            ".TP", "/run/pipexctl/serve.sock", "The socket of \\fBpipexctl serve\\fR (0600, in a 0700 directory).",
            ".TP", "/run/pipexctl/state.json", "What the daemon made; adopted at its next start.",
            ".TP", "/run/pipexctl/discovery.json",
            "Where each xl2tpd log was read to, with what was known there; the next start of this boot "
            "reads on from it.",
            ".TP", "/lib/systemd/system/pipexctl.socket, pipexctl.service",
            "The systemd units (the Debian package; from systemd/ in the source).",
            ".TP", "/etc/default/pipexctl", "PIPEXCTL_OPTS for the unit.",
            ".TP", "/usr/lib/pppd/\\fIVERSION\\fR/pipexctl.so", "The pppd plugin, built for that pppd version exactly.",
            ".SH EXAMPLES", ".nf",
            "systemctl enable \\-\\-now pipexctl.socket pipexctl.service",
            "pipexctl status                     # every call: offloaded, xl2tpd kernel mode or pty (and why)",
            "pipexctl stat \\-\\-serve                # the daemon's counts and the sessions' kernel counters",
            "pipexctl discover \\-\\-json             # xl2tpd's tunnels and calls, with their data path",
            "pipexctl addsess l2tp 10 20 10.99.0.1 10.99.1.2 255.255.255.255 10.99.0.1:1701 10.99.0.2:1701 100 200",
            ".fi",
            ".SH SEE ALSO", "\\fBxl2tpd\\fR(8), \\fBpppd\\fR(8), \\fBip\\-l2tp\\fR(8), \\fBnft\\fR(8), \\fBsystemd.socket\\fR(5);",
            "docs/ in the source: quickstart.md, offload.md, operations.md, ansible.md, cli.md."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
