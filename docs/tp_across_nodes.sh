#!/usr/bin/env bash
# Regenerates docs/tp_across_nodes.png: the same job (GPT-3 1.3B, tp=8 x dp=2, 2 DGX H100
# nodes) with each TP group inside a node (Megatron's order) above, and TP strided over
# both nodes (--rank-order dp-tp-cp-ep-pp) below: the 'tp' lanes grow, the step slows.
set -euo pipefail
cd "$(dirname "$0")"
tmp=$(mktemp -d)
common=(--model gpt3-1.3b --tp 8 --dp 2 --pp 1 --microbatches 2 --topology dgx-h100-x16-ndr)
clustersim simulate "${common[@]}" -o "$tmp/a.html" --timeline-json "$tmp/inside.json" >/dev/null
clustersim simulate "${common[@]}" --rank-order dp-tp-cp-ep-pp -o "$tmp/b.html" \
    --timeline-json "$tmp/across.json" >/dev/null
clustersim compare "$tmp/across.json" "$tmp/inside.json" -o "$tmp/compare.html"
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --hide-scrollbars --user-data-dir="$tmp/profile" --virtual-time-budget=15000 \
    --window-size=1600,900 --screenshot="$PWD/tp_across_nodes.png" "file://$tmp/compare.html" 2>/dev/null
rm -rf "$tmp"
echo "wrote docs/tp_across_nodes.png"
