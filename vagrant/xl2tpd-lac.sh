#!/bin/sh
# The LAC box: Debian's xl2tpd dialling the LNS (plain userspace mode, no
# pipexctl here: the offload on one side interoperates with a plain peer).
set -eu
LOCAL="$1"
LNS="$2"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q xl2tpd ppp iperf3
cat > /etc/xl2tpd/xl2tpd.conf <<CONF
[global]
listen-addr = $LOCAL
port = 1701

[lac lns]
lns = $LNS
require authentication = no
refuse pap = yes
refuse chap = yes
name = lac
length bit = yes
redial = no
pppoptfile = /etc/ppp/options.xl2tpd.lac
CONF
cat > /etc/ppp/options.xl2tpd.lac <<'OPTS'
noauth
nodefaultroute
mtu 1400
mru 1400
ipcp-accept-local
ipcp-accept-remote
OPTS
systemctl restart xl2tpd
