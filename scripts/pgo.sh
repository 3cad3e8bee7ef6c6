#!/usr/bin/env bash
# Builds snag with profile-guided optimization into target/pgo/snag. An instrumented
# build first carries the traffic snag is measured on — TCP relay with and without
# faults and with a capture, HTTP mode plain and with a fault, TLS and HTTP/2 on
# both legs, snag load — and counts which branches and calls it takes; the release
# build is then inlined and laid out by those counts, so that the code one request
# runs sits together instead of spread over the binary. Two release builds and a
# minute and a half of traffic: about 15 minutes on two cores.
#
#   scripts/pgo.sh [--seconds 3]    # seconds of traffic per step of the training
#
# Needs llvm-profdata of the LLVM major version rustc was built with (Debian's
# llvm-N, which scripts/install-deps.sh installs), wrk and nginx.
set -euo pipefail

seconds=3
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    *) echo "usage: $0 [--seconds N]" >&2; exit 2 ;;
  esac
done
case $seconds in '' | *[!0-9]* | 0) echo "pgo: --seconds takes a whole number above 0, not '$seconds'" >&2; exit 2 ;; esac

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
llvm=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
profdata=""
sysroot_tool="$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin/llvm-profdata"
for candidate in "llvm-profdata-$llvm" "/usr/lib/llvm-$llvm/bin/llvm-profdata" "$sysroot_tool"; do
  if command -v "$candidate" >/dev/null 2>&1; then profdata=$candidate; break; fi
done
if [ -z "$profdata" ]; then
  echo "pgo: no llvm-profdata for LLVM $llvm, the version rustc was built with (Debian: llvm-$llvm, which scripts/install-deps.sh installs; rustup: the llvm-tools component)" >&2
  exit 2
fi
for tool in wrk nginx python3; do
  command -v "$tool" >/dev/null || { echo "pgo: $tool not found; run scripts/install-deps.sh" >&2; exit 2; }
done

# shellcheck source=scripts/loopback.sh
source "$root/scripts/loopback.sh"
loopback_setup pgo

# Each build in a target directory of its own: RUSTFLAGS differ, and a plain
# `cargo build --release` must not rebuild everything after this. The instrumented
# build's flags stay the same from run to run, so that cargo keeps it; where its
# counts go is told at run time (LLVM_PROFILE_FILE, one file per process).
step() { printf 'pgo: %s\n' "$*" >&2; }
step "instrumented build (target/pgo-gen)…"
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-generate=$root/target/pgo-gen/profiles" \
  cargo build --release -q --target-dir target/pgo-gen
gen=target/pgo-gen/release/snag
export LLVM_PROFILE_FILE="$work/profiles/snag-%p.profraw"

# The origin: nginx with a small page and a 4 MiB file, as in scripts/bench.sh.
nginx_port=$(free_port)
mkdir -p "$work/www" "$work/nginx"
printf 'hello from nginx\n' > "$work/www/small"
head -c $((4 << 20)) /dev/urandom > "$work/www/4m"
cat > "$work/nginx/nginx.conf" <<CONF
daemon off;
worker_processes 1;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 4000; }
http {
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path $work/nginx; proxy_temp_path $work/nginx; fastcgi_temp_path $work/nginx;
  uwsgi_temp_path $work/nginx; scgi_temp_path $work/nginx;
  server { listen 127.0.0.1:$nginx_port; root $work/www; }
}
CONF
nginx -c "$work/nginx/nginx.conf" -p "$work/nginx" & pids+=($!)
wait_port "$nginx_port"

declare -A port
trained=()
start() { # name, upstream port, then snag proxy's flags
  local name=$1 upstream=$2; shift 2
  port[$name]=$(free_port)
  "$gen" proxy --listen "127.0.0.1:${port[$name]}" --upstream "127.0.0.1:$upstream" --seed 1 "$@" \
    >/dev/null 2>>"$work/snag.log" &
  pids+=($!)
  trained+=($!)
}
start relay "$nginx_port"
start latency0 "$nginx_port" --fault latency:latency=0
start bandwidth "$nginx_port" --fault bandwidth:rate=100000000
start slicer "$nginx_port" --fault slicer:average_size=1048576,size_variation=0,delay=0
start capture "$nginx_port" --capture "$work/train.pcapng" --snaplen 128
start http "$nginx_port" --mode http
start http_fault "$nginx_port" --mode http --fault http_status:status=503,toxicity=0.1
# TLS and HTTP/2 on both legs: a snag backend over TLS, a proxy speaking h2 to it.
backend_port=$(free_port)
"$gen" backend --id pgo --listen "127.0.0.1:$backend_port" --tls-generate "$work/backend-ca.pem" \
  >/dev/null 2>>"$work/snag.log" &
pids+=($!)
trained+=($!)
wait_port "$backend_port"
start h2 "$backend_port" --mode http --tls-generate "$work/proxy-ca.pem" \
  --upstream-protocol h2 --upstream-ca "$work/backend-ca.pem"
for name in "${!port[@]}"; do wait_port "${port[$name]}"; done

step "training: ${seconds} s per step…"
for name in relay latency0 bandwidth slicer capture http http_fault; do
  for c in 1 32 256; do
    wrk -t"$((c > 1 ? 2 : 1))" -c"$c" -d"${seconds}s" "http://127.0.0.1:${port[$name]}/small" >/dev/null
  done
done
for name in relay latency0 http; do
  wrk -t1 -c1 -d"${seconds}s" "http://127.0.0.1:${port[$name]}/4m" >/dev/null
done
"$gen" load -c 32 -d "${seconds}s" "http://127.0.0.1:${port[http]}/small" >/dev/null
"$gen" load -c 32 -d "${seconds}s" --http2 --cacert "$work/proxy-ca.pem" \
  "https://127.0.0.1:${port[h2]}/" >/dev/null
"$gen" load -c 8 -d "${seconds}s" --cacert "$work/proxy-ca.pem" \
  "https://127.0.0.1:${port[h2]}/" >/dev/null
# The counts are written when each process exits: a signal it handles, then a wait.
for pid in "${trained[@]}"; do kill -TERM "$pid"; done
for pid in "${trained[@]}"; do wait "$pid" 2>/dev/null || true; done
unset LLVM_PROFILE_FILE
ls "$work"/profiles/*.profraw >/dev/null 2>&1 || { echo "pgo: the training wrote no profile" >&2; exit 1; }
"$profdata" merge -o "$work/snag.profdata" "$work/profiles"
# A path of its own for each profile: cargo rebuilds when RUSTFLAGS change, not
# when the file a flag names does, and every crate must be built with the new counts.
profile="$root/target/pgo/snag-$(cksum < "$work/snag.profdata" | cut -d' ' -f1).profdata"
mkdir -p target/pgo
rm -f target/pgo/snag-*.profdata
cp "$work/snag.profdata" "$profile"

step "optimized build (target/pgo-use)…"
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$profile" \
  cargo build --release -q --target-dir target/pgo-use
cp target/pgo-use/release/snag target/pgo/snag
step "built target/pgo/snag"
