"""pipexctl: offload xl2tpd/pppd L2TP sessions to the Linux kernel."""

__version__ = "0.1.0"
