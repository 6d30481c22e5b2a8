#!/usr/bin/env bash
# Prints the apt source line for Debian 13 (trixie, main) on the Debian
# archive this machine's own apt sources name; fails if they name none.
# Used by fetch_trixie_ppp.sh and debian13_root.sh.
set -euo pipefail
uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[ -n "$uri" ] || uri=$(awk '$1 == "deb" && $0 ~ /debian/ {for (i = 2; i <= NF; i++) if ($i ~ /^(https?|file):/) {print $i; exit}}' \
  /etc/apt/sources.list 2>/dev/null || true)
[ -n "$uri" ] || { echo "trixie_source: no Debian archive in this machine's apt sources" >&2; exit 1; }
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri trixie main"
