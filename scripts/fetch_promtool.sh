#!/usr/bin/env bash
# promtool from Debian 12's prometheus package, unpacked under .cache/promtool/
# (the package itself is not installed: it would add a user and a service):
# tests/unit/test_metrics.py checks contrib/prometheus-alerts.yml with it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.cache/promtool
[ -x "$out/usr/bin/promtool" ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download -q prometheus >/dev/null)
rm -rf "$out"
dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
mkdir -p "$out/usr/bin"
cp "$tmp/x/usr/bin/promtool" "$out/usr/bin/"
echo "fetch_promtool: $(basename "$tmp"/prometheus_*.deb) -> $out/usr/bin/promtool"
