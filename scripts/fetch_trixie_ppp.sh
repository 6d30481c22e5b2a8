#!/usr/bin/env bash
# Debian 13's ppp and ppp-dev (pppd 2.5.2), unpacked under .cache/trixie-ppp/,
# for the plugin's build test against the pppd 2.5 API (tests/unit/test_plugin_build.py).
# The machine stays Debian 12: a private apt configuration (its own source
# list, lists and cache under .cache/) asks the same archive this machine's
# apt sources name for trixie; nothing of the system's apt state changes.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.cache/trixie-ppp
[ -f "$out/dev/usr/include/pppd/pppd.h" ] && [ -x "$out/ppp/usr/sbin/pppd" ] && exit 0
src=$(bash scripts/trixie_source.sh)
apt=$PWD/.cache/trixie-apt
rm -rf "$apt" "$out"
mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$out"
echo "$src" > "$apt/sources.list"
o=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null -o "Dir::State::Lists=$apt/lists"
   -o "Dir::Cache=$apt/cache" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
apt-get "${o[@]}" update -q >/dev/null
(cd "$apt" && apt-get "${o[@]}" download -q ppp ppp-dev >/dev/null)
dpkg-deb -x "$apt"/ppp-dev_*.deb "$out/dev"
dpkg-deb -x "$apt"/ppp_*_amd64.deb "$out/ppp"
echo "fetch_trixie_ppp: $(ls "$apt"/*.deb | xargs -n1 basename | tr '\n' ' ')-> $out"
rm -rf "$apt"
