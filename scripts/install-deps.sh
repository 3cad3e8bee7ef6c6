#!/usr/bin/env bash
# Installs the Debian packages snag's tests and benchmarks use. Needs root (or sudo).
#   tests: curl (HTTP/1.1 and h2c client), nghttp2-client, iproute2 (ss)
#   benchmark: wrk, nginx, haproxy   capture checks: tshark   case report: chromium
set -euo pipefail
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends iproute2 curl nghttp2-client wrk nginx haproxy tshark python3 chromium
