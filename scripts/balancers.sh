#!/usr/bin/env bash
# Every case against every bundled balancer: the built-in one, HAProxy, nginx, Caddy
# and Traefik (scripts/install-deps.sh installs them), in --quick mode, with the
# side-by-side table at the end. About 20 minutes on two cores, so it is not part of
# `cargo test` (tests/drivers.rs runs a few cases per product there).
#
#   scripts/balancers.sh                         # seed 2, report in reports/balancers
#   scripts/balancers.sh --seed 7 --report-dir /tmp/matrix
#
# Extra arguments go to `snag case`. SNAG_BIN=path runs that binary instead of
# building a release one.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${SNAG_BIN:-}" ]]; then
    cargo build --release --quiet
    SNAG_BIN=target/release/snag
fi
args=("$@")
[[ " ${args[*]} " == *" --seed "* ]] || args+=(--seed 2)
[[ " ${args[*]} " == *" --report-dir "* ]] || args+=(--report-dir reports/balancers)
exec "$SNAG_BIN" case all --balancer builtin,haproxy,nginx,caddy,traefik --quick "${args[@]}"
