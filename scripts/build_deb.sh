#!/usr/bin/env bash
# `make deb`: dist/pipexctl_<version>_amd64.deb, with Debian's dpkg-deb.
#
# - the package and its Python dependencies under /usr/lib/pipexctl/python
#   (Debian 12's python3-pyroute2 is too old), run by
#   Debian's python3 (3.11: the same minor as the compiled wheels);
# - the pppd plugin built against this machine's ppp-dev, in that pppd's
#   plugin directory, with `Depends: ppp (= <that exact version>)`: pppd
#   refuses a plugin built for another version;
# - pipexctl.socket/.service, the modules-load file, /etc/default/pipexctl,
#   the man page, bash completion, the docs.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=$(.venv/bin/python -c 'import pipexctl; print(pipexctl.__version__)')
PPP_VERSION=$(dpkg-query -W -f='${Version}' ppp)
PPPD_VERSION=$(pppd --version 2>&1 | awk '{print $3}')
PYVER=$(/usr/bin/python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
VENVVER=$(.venv/bin/python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
if [ "$PYVER" != "$VENVVER" ]; then
  echo "build_deb: Debian's python3 is $PYVER but the build venv is $VENVVER: the wheels would not load" >&2
  exit 1
fi
NEXT=$(/usr/bin/python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1] + 1}")')

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root="$work/pipexctl_${VERSION}_amd64"
mkdir -p "$root/DEBIAN" "$root/usr/bin" "$root/usr/lib/pipexctl" "$root/usr/lib/pppd/$PPPD_VERSION" \
         "$root/lib/systemd/system" "$root/usr/lib/modules-load.d" "$root/etc/default" \
         "$root/usr/share/man/man8" "$root/usr/share/bash-completion/completions" "$root/usr/share/doc/pipexctl"

.venv/bin/python -m pip install -q --no-compile --target "$root/usr/lib/pipexctl/python" .
rm -rf "$root/usr/lib/pipexctl/python/bin"
cat > "$root/usr/bin/pipexctl" <<'EOF'
#!/usr/bin/python3 -I
import sys
sys.path.insert(0, "/usr/lib/pipexctl/python")
from pipexctl.entry import main
main()
EOF
chmod 0755 "$root/usr/bin/pipexctl"

make -s -C plugins -B pipexctl.so
install -m 0644 plugins/pipexctl.so "$root/usr/lib/pppd/$PPPD_VERSION/pipexctl.so"

sed 's|/opt/pipexctl/venv/bin/pipexctl|/usr/bin/pipexctl|; s|file:///opt/pipexctl/docs/offload.md|man:pipexctl(8)|' \
  systemd/pipexctl.service > "$root/lib/systemd/system/pipexctl.service"
sed 's|file:///opt/pipexctl/docs/offload.md|man:pipexctl(8)|' systemd/pipexctl.socket > "$root/lib/systemd/system/pipexctl.socket"
install -m 0644 systemd/pipexctl-modules.conf "$root/usr/lib/modules-load.d/pipexctl.conf"
cat > "$root/etc/default/pipexctl" <<'EOF'
# Options of `pipexctl serve` under pipexctl.service (pipexctl serve --help).
# The default: log each offload (-v), and ask xl2tpd's control pipe.
#PIPEXCTL_OPTS="-v --control /var/run/xl2tpd/l2tp-control"
EOF
gzip -9n < docs/pipexctl.8 > "$root/usr/share/man/man8/pipexctl.8.gz"
_PIPEXCTL_COMPLETE=bash_source .venv/bin/pipexctl > "$root/usr/share/bash-completion/completions/pipexctl"
cp README.md docs/*.md "$root/usr/share/doc/pipexctl/"
cat > "$root/usr/share/doc/pipexctl/copyright" <<'EOF'
pipexctl: kernel offload for L2TP/PPP sessions of xl2tpd.
The bundled Python packages under /usr/lib/pipexctl/python keep their own
licence files in their *.dist-info directories.
EOF

size=$(du -sk "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<EOF
Package: pipexctl
Version: $VERSION
Architecture: amd64
Maintainer: pipexctl developers <pipexctl@localhost>
Installed-Size: $size
Depends: python3 (>= $PYVER), python3 (<< $NEXT), ppp (= $PPP_VERSION), nftables, iproute2
Recommends: xl2tpd
Section: net
Priority: optional
Description: kernel offload for xl2tpd's L2TP/PPP calls
 pipexctl serve and the pppd plugin pipexctl.so give each call of a
 userspace-mode xl2tpd a kernel L2TP session and PPPoL2TP channel, so PPP
 data no longer crosses a pty. Also: discovery of xl2tpd's tunnels and
 calls, and commands for kernel L2TP tunnels and sessions.
 The plugin is built for pppd $PPPD_VERSION exactly.
EOF
echo "/etc/default/pipexctl" > "$root/DEBIAN/conffiles"
cat > "$root/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
fi
# not enabled by itself: `systemctl enable --now pipexctl.socket pipexctl.service`,
# then `plugin pipexctl.so` in xl2tpd's pppd options file (docs: pipexctl(8))
exit 0
EOF
cat > "$root/DEBIAN/prerm" <<'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
  # the offloaded calls keep running (pppd holds their sockets)
  systemctl stop pipexctl.service pipexctl.socket 2>/dev/null || true
fi
# the bytecode Python wrote while pipexctl ran: no package owns it
find /usr/lib/pipexctl/python -name __pycache__ -type d -prune -exec rm -rf {} + 2>/dev/null || true
exit 0
EOF
cat > "$root/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = purge ]; then
  rm -rf /run/pipexctl
  # the twins' steering table, if the daemon left one
  if command -v nft >/dev/null 2>&1; then nft delete table ip pipexctl 2>/dev/null || true; fi
fi
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
exit 0
EOF
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"

mkdir -p dist
rm -f dist/pipexctl_*_amd64.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "dist/pipexctl_${VERSION}_amd64.deb" >/dev/null
echo "dist/pipexctl_${VERSION}_amd64.deb (ppp $PPP_VERSION, pppd $PPPD_VERSION, python3 $PYVER)"
