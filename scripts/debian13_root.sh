#!/usr/bin/env bash
# The Debian 13 (trixie) guest's root: .cache/debian13-root, built with
# mmdebstrap from the archive this machine's apt sources name (kernel 6.12,
# pppd 2.5.2, xl2tpd 1.3.18, Python 3.13), a venv at /opt/pipexctl-venv
# with pipexctl's Python dependencies, and pipexctl.so built for its pppd.
# Rebuilt when the package list or pyproject.toml changes; the plugin is
# rebuilt on every run (cheap).  The guest boots it with
# `python -m pipexctl.testing.vm --flavour debian13`.
set -euo pipefail
cd "$(dirname "$0")/.."
root=.cache/debian13-root
pkgs=linux-image-amd64,tiny-initramfs,kmod,busybox,ppp,xl2tpd,iproute2,iputils-ping,nftables,iperf3,ethtool,procps,psmisc,curl,tcpdump,gcc,libc6-dev,python3,python3-venv,ca-certificates
want=$(printf '%s\n%s\n' "$pkgs" "$(sha256sum pyproject.toml | cut -d' ' -f1)" | sha256sum | cut -c1-16)
if [ "$(cat "$root/.pipexctl-stamp" 2>/dev/null)" != "$want" ]; then
  src=$(bash scripts/trixie_source.sh)
  rm -rf "$root.new"
  echo "setup: building the Debian 13 guest root (mmdebstrap trixie) ..."
  mmdebstrap --quiet --mode=root --variant=minbase --components=main --include="$pkgs" trixie "$root.new" "$src"
  deps=$(.venv/bin/python -c '
import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print(" ".join(p["dependencies"] + p["optional-dependencies"]["test"]))')
  # wheels for the root's Python, fetched by this machine's pip (its index and
  # certificates), installed inside with no index
  pyv=$(chroot "$root.new" python3 -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
  mkdir -p "$root.new/tmp/wheels"
  # shellcheck disable=SC2086
  .venv/bin/python -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version "$pyv" \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --platform any -d "$root.new/tmp/wheels" $deps
  chroot "$root.new" python3 -m venv /opt/pipexctl-venv
  # shellcheck disable=SC2086
  chroot "$root.new" /opt/pipexctl-venv/bin/pip install -q --disable-pip-version-check --no-index \
    --find-links /tmp/wheels $deps
  rm -rf "$root.new/tmp/wheels"
  echo "$want" > "$root.new/.pipexctl-stamp"
  rm -rf "$root"
  mv "$root.new" "$root"
fi
# pipexctl.so for the root's pppd, from this checkout, against the same pppd's headers
v=$(chroot "$root" pppd --version 2>&1 | awk '{print $3}')
[ -f .cache/trixie-ppp/dev/usr/include/pppd/pppd.h ] || bash scripts/fetch_trixie_ppp.sh
mkdir -p "$root/usr/lib/pppd/$v"
gcc -O2 -g -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -DPPP_API_25 \
  -I.cache/trixie-ppp/dev/usr/include -fPIC -shared -o "$root/usr/lib/pppd/$v/pipexctl.so" plugins/pipexctl.c
