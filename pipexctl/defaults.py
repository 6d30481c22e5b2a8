"""The defaults operators see, in one place: paths and ports as Debian's
xl2tpd and the shipped systemd units use them."""

from __future__ import annotations

# the daemon's request socket; its state file and discovery checkpoint go beside it
SERVE_SOCKET = "/run/pipexctl/serve.sock"
# xl2tpd's control pipe (its -C)
XL2TPD_CONTROL = "/var/run/xl2tpd/l2tp-control"
# L2TP's UDP port, xl2tpd's `port`
L2TP_PORT = 1701
