#!/bin/sh
# The LNS box: Debian's xl2tpd in userspace mode (the case pipexctl offloads).
set -eu
LOCAL="$1"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q xl2tpd ppp iperf3
cat > /etc/xl2tpd/xl2tpd.conf <<CONF
[global]
listen-addr = $LOCAL
port = 1701
; userspace mode: the pty data path, which pipexctl takes into the kernel
force userspace = yes

[lns default]
ip range = 10.99.100.2-10.99.100.250
local ip = 10.99.100.1
require authentication = no
refuse pap = yes
refuse chap = yes
name = lns
length bit = yes
pppoptfile = /etc/ppp/options.xl2tpd.lns
CONF
cat > /etc/ppp/options.xl2tpd.lns <<'OPTS'
noauth
nodefaultroute
mtu 1400
mru 1400
OPTS
systemctl restart xl2tpd
