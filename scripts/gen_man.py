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
    out += [".SH EXIT STATUS", "0 success; 1 an operational error (one line on stderr); 2 a usage error.",
            ".SH FILES",
            ".TP", "/run/pipexctl/serve.sock", "The socket of \\fBpipexctl serve\\fR (0600, in a 0700 directory).",
            ".TP", "/run/pipexctl/state.json", "What the daemon made; adopted at its next start.",
            ".TP", "/etc/systemd/system/pipexctl.service", "The systemd unit (from systemd/ in the source).",
            ".SH SEE ALSO", "\\fBxl2tpd\\fR(8), \\fBpppd\\fR(8), \\fBip\\-l2tp\\fR(8), \\fBnft\\fR(8);",
            "docs/ in the source: quickstart.md, offload.md, operations.md, ansible.md, cli.md."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
