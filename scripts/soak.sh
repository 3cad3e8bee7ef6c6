#!/usr/bin/env bash
# Soak: 9,000 connections held through a `snag serve` process (TCP and HTTP modes)
# while faults are added, changed and removed through the API every second and a
# drain comes every minute; then checks that nothing leaked and no byte was lost.
#
#   scripts/soak.sh                      # 10 minutes, 9,000 connections
#   scripts/soak.sh --duration 60s       # what CI runs
#   scripts/soak.sh --connections 4000 --rate 2000 --report-dir /tmp/soak
#
# Figures go to reports/soak/soak.json and a chart to reports/soak/index.html.
# SNAG_BIN=path runs that binary instead of building a release one.
set -euo pipefail
cd "$(dirname "$0")/.."
hard=$(ulimit -Hn)
soft=$(ulimit -Sn)
ulimit -n "$hard"
if [[ "$soft" == "$hard" ]]; then
    echo "ulimit -n: $hard, already the hard limit; snag soak and the snag serve it starts both get it"
else
    echo "ulimit -n: raised from $soft to $(ulimit -n), the hard limit; snag soak and the snag serve it starts both get it"
fi
if [[ -z "${SNAG_BIN:-}" ]]; then
    cargo build --release --quiet
    SNAG_BIN=target/release/snag
fi
exec "$SNAG_BIN" soak "$@"
