"""Stand-in pppds for the benches that run without real calls: a tiny C
program forks N children named ``pppd`` that wait (each dies with the
farm), and prints their pids."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

FARM_C = r"""
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int n = atoi(argv[1]);
    for (int i = 0; i < n; i++) {
        pid_t p = fork();
        if (p < 0) { perror("fork"); return 1; }
        if (p == 0) { close(1); prctl(PR_SET_PDEATHSIG, SIGKILL); prctl(PR_SET_NAME, "pppd"); for (;;) pause(); }
        printf("%d\n", (int)p);
    }
    fflush(stdout);
    fclose(stdout);
    for (;;) pause();
}
"""


def pppd_farm(n: int, d: str) -> tuple[subprocess.Popen[bytes], list[int]]:
    """N processes named pppd, children of the farm (built in directory ``d``): the farm and their pids."""
    src, exe = os.path.join(d, "farm.c"), os.path.join(d, "farm")
    Path(src).write_text(FARM_C)
    subprocess.run(["cc", "-O2", "-o", exe, src], check=True)
    farm = subprocess.Popen([exe, str(n)], stdout=subprocess.PIPE)
    assert farm.stdout is not None
    pids = [int(x) for x in farm.stdout.read().split()]
    if len(pids) != n:
        farm.kill()
        raise SystemExit(f"the pppd farm made {len(pids)} of {n} processes")
    return farm, pids
