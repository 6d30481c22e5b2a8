#!/bin/sh
# On the LAC: dial, wait for ppp0, then measure through the LNS's offload.
set -eu
echo "c lns" > /var/run/xl2tpd/l2tp-control
for i in $(seq 60); do ip -br addr show ppp0 2>/dev/null | grep -q 10.99.100. && break; sleep 1; done
ip -br addr show ppp0
ping -c 3 10.99.100.1
echo "On the LNS: sudo /opt/pipexctl/venv/bin/pipexctl stat --serve   (the offloaded session's counters)"
