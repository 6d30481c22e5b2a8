"""Stand-ins for the benches that run without real calls: pppds (a tiny C
program forks N children named ``pppd`` that wait, each dying with the
farm, and prints their pids; it can stand for an LNS's xl2tpd too) and
xl2tpd's log lines for their calls."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

FARM_C = r"""
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>
/* farm N [xl2tpd PADDING]: with "xl2tpd", the farm is named xl2tpd and each
   child writes an LNS pppd's command line over its arguments (PADDING makes
   room), as /proc shows a real one's */
int main(int argc, char **argv) {
    int n = atoi(argv[1]), lns = argc > 3 && strcmp(argv[2], "xl2tpd") == 0;
    char *area = argv[0];
    size_t size = (size_t)(argv[argc - 1] + strlen(argv[argc - 1]) - argv[0]);
    if (lns) prctl(PR_SET_NAME, "xl2tpd");
    for (int i = 0; i < n; i++) {
        pid_t p = fork();
        if (p < 0) { perror("fork"); return 1; }
        if (p == 0) {
            close(1); prctl(PR_SET_PDEATHSIG, SIGKILL); prctl(PR_SET_NAME, "pppd");
            if (lns) {
                char cmd[256];
                int len = snprintf(cmd, sizeof cmd, "/usr/sbin/pppd%c/dev/pts/%d%cpassive%cnodetach%c"
                                   "10.96.0.1:10.96.%d.%d%crefuse-pap%cname%clns%cfile%c/etc/ppp/options.xl2tpd",
                                   0, i + 1, 0, 0, 0, 1 + i / 250, 1 + i % 250, 0, 0, 0, 0, 0);
                memset(area, 0, size);
                memcpy(area, cmd, (size_t)len < size ? (size_t)len : size - 1);
            }
            for (;;) pause();
        }
        printf("%d\n", (int)p);
    }
    fflush(stdout);
    fclose(stdout);
    for (;;) pause();
}
"""


def argv_lines(n: int) -> tuple[str, ...]:
    """The pppd command line xl2tpd logs for LNS call ``n`` in userspace
    mode, as it writes it: the call's own pty, and the addresses its ``ip
    range`` gave the call (one pair per call)."""
    return ("start_pppd: I'm running: ", '"/usr/sbin/pppd" ', f'"/dev/pts/{n + 1}" ', '"passive" ', '"nodetach" ',
            f'"10.96.0.1:10.96.{1 + n // 250}.{1 + n % 250}" ', '"refuse-pap" ', '"name" ', '"lns" ', '"file" ',
            '"/etc/ppp/options.xl2tpd" ')


def call_lines(prefix: str, net: str, n: int, pid: int, argv: bool = False) -> list[str]:
    """xl2tpd's lines for LNS call ``n`` of pppd ``pid``, in a tunnel of its
    own from peer ``net``.X.Y (``argv``: with the pppd command line it logs)."""
    peer, tid, cid = f"{net}.{1 + n // 250}.{1 + n % 250}", 1000 + n, 3000 + n
    return [prefix + ln for ln in (
        f"Connection established to {peer}, 1701.  Local: {tid}, Remote: {tid + 1000} (ref=0/0).  "
        "LNS session is 'default'",
        *(argv_lines(n) if argv else ()),
        f"Call established with {peer}, PID: {pid}, Local: {cid}, Remote: {cid + 1000}, Serial: 1")]


def pppd_farm(n: int, d: str, as_xl2tpd: bool = False) -> tuple[subprocess.Popen[bytes], list[int]]:
    """N processes named pppd, children of the farm (built in directory ``d``): the farm and their pids.
    ``as_xl2tpd``: the farm is named xl2tpd and each child shows an LNS pppd's argv, as an LNS's /proc does."""
    src, exe = os.path.join(d, "farm.c"), os.path.join(d, "farm")
    Path(src).write_text(FARM_C)
    subprocess.run(["cc", "-O2", "-o", exe, src], check=True)
    farm = subprocess.Popen([exe, str(n), *(["xl2tpd", "x" * 200] if as_xl2tpd else [])], stdout=subprocess.PIPE)
    assert farm.stdout is not None
    pids = [int(x) for x in farm.stdout.read().split()]
    if len(pids) != n:
        farm.kill()
        raise SystemExit(f"the pppd farm made {len(pids)} of {n} processes")
    return farm, pids
