#!/usr/bin/env bash
# Regenerates docs/gantt.png, the README's picture: the default simulation rendered by
# headless Chromium (Debian package `chromium`).
set -euo pipefail
cd "$(dirname "$0")"
tmp=$(mktemp -d)
clustersim simulate --pp 4 --microbatches 8 -o "$tmp/gantt.html" >/dev/null
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --hide-scrollbars --user-data-dir="$tmp/profile" --virtual-time-budget=15000 \
    --window-size=1600,900 --screenshot="$PWD/gantt.png" "file://$tmp/gantt.html" 2>/dev/null
rm -rf "$tmp"
echo "wrote docs/gantt.png"
