#!/usr/bin/env bash
# Passthrough speed and memory of snag against a direct connection and HAProxy in
# `mode tcp`, all measured in the same run on this machine, reported as ratios to
# direct. wrk drives nginx (both from Debian packages), interleaved target by
# target, median of --rounds runs each.
#
#   scripts/bench.sh [--duration 5] [--rounds 3] [--idle 5000]
#
# Needs: wrk, nginx, haproxy, python3 (scripts/install-deps.sh installs them).
set -euo pipefail

duration=5 rounds=3 idle=5000
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --idle) idle=$2; shift 2 ;;
    *) echo "usage: $0 [--duration SECONDS] [--rounds N] [--idle CONNECTIONS]" >&2; exit 2 ;;
  esac
done
for tool in wrk nginx haproxy python3; do
  command -v "$tool" >/dev/null || { echo "bench: $tool not found; run scripts/install-deps.sh" >&2; exit 2; }
done

root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/snag-bench.XXXXXX)
chmod 755 "$work" # nginx workers run as www-data and must read www/
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
ulimit -n "$(ulimit -Hn)"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { # port: wait up to 10 s for something to accept on it
  for _ in $(seq 100); do
    python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),0.1)" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "bench: nothing listens on port $1 after 10 s" >&2; exit 1
}

(cd "$root" && cargo build --release -q)
snag="$root/target/release/snag"

# nginx: a small page and a 10 MiB file, one worker (the machine has two cores and
# wrk needs one), no logs.
nginx_port=$(free_port)
mkdir -p "$work/www" "$work/nginx"
printf 'hello from nginx\n' > "$work/www/small"
head -c $((10 << 20)) /dev/urandom > "$work/www/10m"
cat > "$work/nginx/nginx.conf" <<CONF
daemon off;
worker_processes 1;
worker_rlimit_nofile 20000;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 19000; }
http {
  access_log off;
  keepalive_requests 1000000;
  keepalive_timeout 300s;
  client_body_temp_path $work/nginx; proxy_temp_path $work/nginx; fastcgi_temp_path $work/nginx;
  uwsgi_temp_path $work/nginx; scgi_temp_path $work/nginx;
  server { listen 127.0.0.1:$nginx_port; root $work/www; }
}
CONF
nginx -c "$work/nginx/nginx.conf" -p "$work/nginx" & pids+=($!)
wait_port "$nginx_port"

snag_port=$(free_port)
"$snag" proxy --listen "127.0.0.1:$snag_port" --upstream "127.0.0.1:$nginx_port" --seed 1 >/dev/null & pids+=($!)
snag_pid=$!
wait_port "$snag_port"

lat_port=$(free_port)
"$snag" proxy --listen "127.0.0.1:$lat_port" --upstream "127.0.0.1:$nginx_port" --seed 1 \
  --fault latency:latency=20 >/dev/null & pids+=($!)
wait_port "$lat_port"

cap_port=$(free_port)
"$snag" proxy --listen "127.0.0.1:$cap_port" --upstream "127.0.0.1:$nginx_port" --seed 1 \
  --capture "$work/bench.pcapng" --snaplen 128 >/dev/null & pids+=($!)
wait_port "$cap_port"

haproxy_port=$(free_port)
cat > "$work/haproxy.cfg" <<CONF
global
  maxconn 9000
defaults
  mode tcp
  timeout connect 5s
  timeout client 300s
  timeout server 300s
listen bench
  bind 127.0.0.1:$haproxy_port
  server nginx 127.0.0.1:$nginx_port
CONF
haproxy -f "$work/haproxy.cfg" -db & pids+=($!)
haproxy_pid=$!
wait_port "$haproxy_port"

# Idle connections, measured first, on fresh processes: RSS of snag and of HAProxy
# before and after $idle connections are opened through each and left idle.
cat > "$work/idle.py" <<'PY'
import socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]
# Each connection proves it is relayed: one request, one answer, then it idles.
for s in socks:
    s.sendall(b"GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
for s in socks:
    got = b""
    while b"hello from nginx" not in got:
        chunk = s.recv(4096)
        if not chunk or (got + chunk).startswith(b"HTTP/1.1") and b" 200 " not in (got + chunk)[:16]:
            sys.exit("bench: no 200 answer through port %d: %r" % (port, (got + chunk)[:80]))
        got += chunk
print("ready", flush=True)
sys.stdin.readline()
PY
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
idle_cost() { # pid port -> KiB per connection
  local before after ready
  before=$(rss_kib "$1")
  coproc IDLE { python3 "$work/idle.py" "$2" "$idle"; }
  read -r ready <&"${IDLE[0]}" || { echo "bench: idle client failed" >&2; exit 1; }
  after=$(rss_kib "$1")
  echo done >&"${IDLE[1]}"
  wait "$IDLE_PID" || true
  awk -v a="$after" -v b="$before" -v n="$idle" 'BEGIN { printf "%.2f", (a - b) / n }'
}
printf 'idle connections…' >&2
snag_idle=$(idle_cost "$snag_pid" "$snag_port")
# A port scan while many sockets are open: 4 per idle connection relayed by snag.
coproc IDLE { python3 "$work/idle.py" "$snag_port" "$idle"; }
read -r _ <&"${IDLE[0]}"
scan_start=$(date +%s%N)
"$snag" ports --json > "$work/ports.json"
scan_ms=$(( ($(date +%s%N) - scan_start) / 1000000 ))
scan_sockets=$(python3 -c "import json,sys; print(sum(json.load(open(sys.argv[1]))['states'].values()))" "$work/ports.json")
echo done >&"${IDLE[1]}"
wait "$IDLE_PID" || true
hap_idle=$(idle_cost "$haproxy_pid" "$haproxy_port")

declare -A port=([direct]=$nginx_port [snag]=$snag_port [haproxy]=$haproxy_port [capture]=$cap_port)
targets=(direct snag haproxy)

# wrk prints latencies as 1.23us/ms/s and transfer as 1.23KB/MB/GB (base 1024).
to_ms() { awk -v v="$1" 'BEGIN { n=v+0; if (v ~ /us$/) n/=1000; else if (v ~ /[0-9]s$/ && v !~ /ms$/) n*=1000; print n }'; }
to_mib() { awk -v v="$1" 'BEGIN { n=v+0; if (v ~ /GB$/) n*=1024; else if (v ~ /KB$/) n/=1024; else if (v ~ /[0-9]B$/) n/=1048576; print n }'; }

run_wrk() { # target conns path -> "rps p50ms p99ms mibps"
  local t=$1 c=$2 path=$3 threads=2
  [ "$c" -lt 2 ] && threads=1
  local out
  out=$(wrk -t"$threads" -c"$c" -d"${duration}s" --latency "http://127.0.0.1:${port[$t]}$path")
  local rps p50 p99 tps
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  p50=$(to_ms "$(awk '$1=="50%" {print $2}' <<<"$out")")
  p99=$(to_ms "$(awk '$1=="99%" {print $2}' <<<"$out")")
  tps=$(to_mib "$(awk '/^Transfer\/sec/ {print $2}' <<<"$out")")
  if grep -q "Socket errors\|Non-2xx" <<<"$out"; then
    echo "bench: wrk reported errors against $t:" >&2; grep "Socket errors\|Non-2xx" <<<"$out" >&2
  fi
  echo "$rps $p50 $p99 $tps"
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A res
cases=("1 /small" "32 /small" "256 /small" "1 /10m")
total=$(( ${#cases[@]} * ${#targets[@]} * rounds ))
n=0
for round in $(seq "$rounds"); do
  for case in "${cases[@]}"; do
    for t in "${targets[@]}"; do
      n=$((n + 1))
      printf '\r[%3d/%3d] round %d: %-8s %-18s' "$n" "$total" "$round" "$t" "c=${case% *} ${case#* }" >&2
      res["$t|$case|$round"]=$(run_wrk "$t" $case)
    done
  done
done
printf '\r%60s\r' '' >&2

col() { # target case field-index -> median over rounds
  for round in $(seq "$rounds"); do echo "${res["$1|$2|$round"]}" | awk -v f="$3" '{print $f}'; done | median
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f×", a / b; else print "–" }'; }

echo
echo "snag passthrough benchmark: wrk → target → nginx on 127.0.0.1, ${duration} s runs, median of $rounds, $(nproc) cores"
echo
printf '%-26s %14s %14s %14s %10s %10s\n' "measure" "direct" "snag" "haproxy" "snag/dir" "hap/dir"
line() { # label value-format case field
  local d s h
  d=$(col direct "$3" "$4"); s=$(col snag "$3" "$4"); h=$(col haproxy "$3" "$4")
  printf "%-26s %14s %14s %14s %10s %10s\n" "$1" "$(printf "$2" "$d")" "$(printf "$2" "$s")" "$(printf "$2" "$h")" "$(ratio "$s" "$d")" "$(ratio "$h" "$d")"
}
for c in 1 32 256; do
  line "requests/s, $c conn" "%.0f req/s" "$c /small" 1
  line "p50 latency, $c conn" "%.3f ms" "$c /small" 2
  line "p99 latency, $c conn" "%.3f ms" "$c /small" 3
done
line "bulk 10 MiB files, 1 conn" "%.0f MiB/s" "1 /10m" 4

# Latency stage accuracy: p50 through a 20 ms downstream latency fault against p50
# through snag without it, one connection, same run.
lat=()
for round in $(seq "$rounds"); do
  out=$(wrk -t1 -c1 -d"${duration}s" --latency "http://127.0.0.1:$lat_port/small")
  lat+=("$(to_ms "$(awk '$1=="50%" {print $2}' <<<"$out")")")
done
lat50=$(printf '%s\n' "${lat[@]}" | median)
base50=$(col snag "1 /small" 2)
echo
awk -v l="$lat50" -v b="$base50" 'BEGIN { printf "latency stage: p50 %.3f ms with latency=20 vs %.3f ms without: added %.3f ms (target 20 ± 1 ms)\n", l, b, l - b }'

# Capture on against capture off: requests/s at 32 connections, interleaved.
cap=() plain=()
for round in $(seq "$rounds"); do
  printf '\rcapture round %d/%d…' "$round" "$rounds" >&2
  plain+=("$(run_wrk snag 32 /small | awk '{print $1}')")
  cap+=("$(run_wrk capture 32 /small | awk '{print $1}')")
done
printf '\r%40s\r' '' >&2
cap_rps=$(printf '%s\n' "${cap[@]}" | median)
plain_rps=$(printf '%s\n' "${plain[@]}" | median)
awk -v c="$cap_rps" -v p="$plain_rps" 'BEGIN { printf "capture: %.0f req/s with --capture against %.0f without, at 32 conn: %.2f× (target ≥ 0.85×)\n", c, p, c / p }'

# The load generator: closed loop against wrk at 32 connections on the same nginx,
# interleaved; then open loop at rising rates, sent against offered.
gen=() ref=()
for round in $(seq "$rounds"); do
  printf '\rload generator round %d/%d…' "$round" "$rounds" >&2
  ref+=("$(run_wrk direct 32 /small | awk '{print $1}')")
  gen+=("$("$snag" load "http://127.0.0.1:$nginx_port/small" -c 32 -d "${duration}s" --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["requests_per_s"])')")
done
printf '\r%40s\r' '' >&2
gen_rps=$(printf '%s\n' "${gen[@]}" | median)
ref_rps=$(printf '%s\n' "${ref[@]}" | median)
awk -v g="$gen_rps" -v w="$ref_rps" 'BEGIN { printf "load generator, closed loop: snag load %.0f req/s against wrk %.0f at 32 conn: %.2f× (target ≥ 0.9×)\n", g, w, g / w }'
for rate in 5000 10000 20000 40000; do
  "$snag" load "http://127.0.0.1:$nginx_port/small" --rate "$rate" -d "${duration}s" --deadline 1s --json |
    python3 -c 'import json,sys
r = json.load(sys.stdin)
print("load generator, open loop %6d/s: offered %d, sent %d (%.2f%%), ok %d, p99 %s ms" % (
    int(sys.argv[1]), r["offered"], r["sent"], 100.0 * r["sent"] / r["offered"], r["ok"], r["latency_ms"]["p99"]))' "$rate"
done

echo "port scan: snag ports read $scan_sockets sockets in $scan_ms ms, process start included (target: 30,000 in under 100 ms)"
echo "idle connections ($idle, each relayed one request first): snag ${snag_idle} KiB each, haproxy ${hap_idle} KiB each (target: snag ≤ 16 KiB)"
