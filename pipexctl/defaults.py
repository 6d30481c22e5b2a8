"""The defaults operators see, in one place: paths and ports as Debian's
xl2tpd and the shipped systemd units use them, and the daemon's waits."""

from __future__ import annotations

# the daemon's request socket; its state file and discovery checkpoint go beside it
SERVE_SOCKET = "/run/pipexctl/serve.sock"
# xl2tpd's control pipe (its -C)
XL2TPD_CONTROL = "/var/run/xl2tpd/l2tp-control"
# L2TP's UDP port, xl2tpd's `port`
L2TP_PORT = 1701
# the syslog socket xl2tpd's lines go through: the daemon's log barriers go there too
SYSLOG_SOCKET = "/dev/log"
# the C library, by glibc's soname (Debian's): ctypes.util.find_library would
# run `ldconfig -p`, a fork and exec at every command's and the daemon's start
LIBC = "libc.so.6"

# seconds a channel request waits for its call to show in discovery (`pipexctl serve --wait`)
REQUEST_WAIT = 5.0
# seconds between discovery's /proc and kernel scans while calls come and go (`--reconcile-interval`)
RECONCILE_INTERVAL = 5.0
# seconds xl2tpd has to answer one control-pipe request
CONTROL_TIMEOUT = 2.0
