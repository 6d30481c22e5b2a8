#!/usr/bin/env bash
# Install everything pipexctl needs on a Debian 12 machine (run as root).
# Idempotent and fast on re-run: apt only runs when a package is missing,
# pip only when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

# qemu + Debian's kernel: the guest in which the real L2TP/PPP kernel runs.
# ppp/xl2tpd/iperf3/nftables/iproute2: the lab.  gcc + headers: the ABI test
# and the pppd plugin.  busybox-static: the guest's initramfs.
# systemd: systemd-analyze for the unit test of systemd/pipexctl.service.
# mmdebstrap: the Debian 13 guest's root (scripts/debian13_root.sh).
# curl: the kernel test scrapes --metrics with a client that is not ours.
# python3-apt: Ansible's apt module (the role is run for real in the guest).
# ruby: `ruby -c` of vagrant/Vagrantfile.  groff-base: the man page check.
# rsyslog: xl2tpd logging through syslog to a file, in the guest (the log barrier's test).
PKGS=(qemu-system-x86 linux-image-amd64 busybox-static kmod iproute2 iputils-ping nftables
      ppp ppp-dev xl2tpd iperf3 ethtool gcc libc6-dev linux-libc-dev make python3 python3-venv
      systemd curl python3-apt ruby groff-base mmdebstrap rsyslog)

if [ "$(id -u)" != 0 ]; then
  echo "setup: run as root (it installs Debian packages and the guest needs root)" >&2
  exit 1
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  # policy-rc.d: don't start xl2tpd on the host; the lab starts its own in the guest
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

ls /boot/vmlinuz-* >/dev/null 2>&1 || { echo "setup: no kernel image in /boot after installing linux-image-amd64" >&2; exit 1; }

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.pipexctl-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[test]'
  echo "$want" > "$stamp"
fi
# the pppd plugin, built against the installed pppd headers and put in pppd's plugin dir
make -s -C plugins install >/dev/null
# Debian 13's pppd 2.5.2 headers and binary, for the plugin's build test against the 2.5 API
bash scripts/fetch_trixie_ppp.sh
# promtool, for the check of contrib/prometheus-alerts.yml
bash scripts/fetch_promtool.sh
# the Debian 13 guest's root (kernel 6.12, pppd 2.5.2): `make test DEBIAN=13`
bash scripts/debian13_root.sh
# byte-compile now: the guest sees the tree read-only and would recompile every boot
.venv/bin/python -m compileall -q pipexctl tests >/dev/null
echo "setup: ok ($(.venv/bin/pipexctl --version), kernel for the guest: $(ls /boot/vmlinuz-* | tail -1))"
