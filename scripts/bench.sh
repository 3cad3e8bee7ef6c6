#!/usr/bin/env bash
# Speed, timing and memory of snag against anchors measured in the same run on this
# machine, reported as ratios: passthrough against a direct connection and HAProxy
# `mode tcp`; faults whose effect is nil and capture against snag without them; HTTP
# mode against HAProxy `mode http` and nginx `proxy_pass`, plain and each answering
# 10% of requests with 503 (snag with an http_status fault); the precision of the
# timed faults, seen by a client's own clock; memory per idle connection and over
# open/close cycles under a fault. wrk drives nginx (both from Debian packages),
# interleaved target by target, median of --rounds runs each, ratios paired round
# by round with their spread; the interposer's CPU time per request is read from
# /proc beside each figure at 32 connections.
#
#   scripts/bench.sh [--duration 5] [--rounds 3] [--idle 5000] [--allocators] [--plain]
#
# snag is the profile-guided build scripts/pgo.sh makes (target/pgo/snag), as
# scripts/image.sh is told to ship it; --plain measures `cargo build --release`'s
# instead. --allocators also builds snag plainly with jemalloc (the default), with
# glibc's malloc and with mimalloc, and measures the three side by side under a
# fault: memory over the open/close cycles, requests/s and CPU per request at 32
# connections.
#
# Needs: wrk, nginx, haproxy, python3, and for the profile-guided build the
# llvm-profdata of rustc's LLVM (scripts/install-deps.sh installs them).
set -euo pipefail

duration=5 rounds=3 idle=5000 allocators=0 plain=0
while [ $# -gt 0 ]; do
  case "$1" in
    --allocators) allocators=1; shift ;;
    --plain) plain=1; shift ;;
    --duration) duration=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --idle) idle=$2; shift 2 ;;
    *) echo "usage: $0 [--duration SECONDS] [--rounds N] [--idle CONNECTIONS] [--allocators] [--plain]" >&2; exit 2 ;;
  esac
done
for tool in wrk nginx haproxy python3; do
  command -v "$tool" >/dev/null || { echo "bench: $tool not found; run scripts/install-deps.sh" >&2; exit 2; }
done

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/loopback.sh
source "$root/scripts/loopback.sh"
loopback_setup bench

plain_build="$root/target/release/snag"
if [ "$allocators" = 1 ]; then
  printf 'building snag plainly with glibc malloc, mimalloc and jemalloc…' >&2
  (cd "$root" && cargo build --release -q --no-default-features) && cp "$plain_build" "$work/snag-glibc"
  (cd "$root" && cargo build --release -q --features mimalloc) && cp "$plain_build" "$work/snag-mimalloc"
  (cd "$root" && cargo build --release -q) && cp "$plain_build" "$work/snag-jemalloc"
  printf '\r%70s\r' '' >&2
fi
if [ "$plain" = 1 ]; then
  (cd "$root" && cargo build --release -q)
  snag=$plain_build
else
  bash "$root/scripts/pgo.sh"
  snag="$root/target/pgo/snag"
fi
echo "snag: $snag ($([ "$plain" = 1 ] && echo 'cargo build --release' || echo 'profile-guided, scripts/pgo.sh'))"

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

# nginx as a reverse proxy in front of the one above, keep-alive to it: an anchor
# for HTTP mode. Its own process, so it does not share the origin's worker. Its
# second server answers 10% of requests with 503 itself, as snag's http_fault does:
# under wrk's closed loop the requests answered at once let more reach the origin,
# whose queue then makes the tail, so a fault's anchor must do the same.
nginx_proxy_port=$(free_port) nginx_fault_port=$(free_port)
mkdir -p "$work/nginx-proxy"
cat > "$work/nginx-proxy/nginx.conf" <<CONF
daemon off;
worker_processes 1;
worker_rlimit_nofile 20000;
pid $work/nginx-proxy/nginx.pid;
error_log $work/nginx-proxy/error.log warn;
events { worker_connections 9000; }
http {
  access_log off;
  keepalive_requests 1000000;
  keepalive_timeout 300s;
  client_body_temp_path $work/nginx-proxy; proxy_temp_path $work/nginx-proxy; fastcgi_temp_path $work/nginx-proxy;
  uwsgi_temp_path $work/nginx-proxy; scgi_temp_path $work/nginx-proxy;
  upstream origin { server 127.0.0.1:$nginx_port; keepalive 512; }
  split_clients "\${request_id}" \$fault { 10% 1; * ""; }
  server {
    listen 127.0.0.1:$nginx_proxy_port;
    location / { proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }
  }
  server {
    listen 127.0.0.1:$nginx_fault_port;
    location / {
      if (\$fault) { return 503; }
      proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off;
    }
  }
}
CONF
nginx -c "$work/nginx-proxy/nginx.conf" -p "$work/nginx-proxy" & pids+=($!)
declare -A pid_of=([nginx]=$!)

declare -A port
start_snag() { # target, then snag proxy's flags: a snag proxy in front of nginx
  local target=$1; shift
  port[$target]=$(free_port)
  # Their log (the shutdown notice when the bench ends them) is shown only if one fails.
  "$snag" proxy --listen "127.0.0.1:${port[$target]}" --upstream "127.0.0.1:$nginx_port" --seed 1 "$@" \
    >/dev/null 2>>"$work/snag.log" &
  pids+=($!)
  pid_of[$target]=$!
}
# Each fault here has no effect on the bytes: what it costs is the path it takes.
start_snag snag
start_snag latency0 --fault latency:latency=0
start_snag bandwidth --fault bandwidth:rate=100000000
start_snag slicer --fault slicer:average_size=1048576,size_variation=0,delay=0
start_snag capture --capture "$work/bench.pcapng" --snaplen 128
start_snag http --mode http
start_snag http_fault --mode http --fault http_status:status=503,toxicity=0.1
for t in snag latency0 bandwidth slicer capture http http_fault; do wait_port "${port[$t]}"; done
snag_pid=${pid_of[snag]}
snag_port=${port[snag]}
wait_port "$nginx_proxy_port"
wait_port "$nginx_fault_port"

haproxy_port=$(free_port) haproxy_http_port=$(free_port) haproxy_fault_port=$(free_port)
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
listen bench_http
  mode http
  http-reuse always
  bind 127.0.0.1:$haproxy_http_port
  server nginx 127.0.0.1:$nginx_port
# 10% answered with 503 by HAProxy itself: the anchor for snag's http_fault.
listen bench_http_fault
  mode http
  http-reuse always
  bind 127.0.0.1:$haproxy_fault_port
  http-request return status 503 if { rand(100) -m int lt 10 }
  server nginx 127.0.0.1:$nginx_port
CONF
haproxy -f "$work/haproxy.cfg" -db & pids+=($!)
haproxy_pid=$!
pid_of[haproxy]=$haproxy_pid pid_of[haproxy_http]=$haproxy_pid pid_of[nginx_proxy]=${pid_of[nginx]}
pid_of[haproxy_fault]=$haproxy_pid pid_of[nginx_fault]=${pid_of[nginx]}
wait_port "$haproxy_port"
wait_port "$haproxy_http_port"
wait_port "$haproxy_fault_port"

# Idle connections, measured first, on fresh processes: RSS of snag and of HAProxy
# before and after $idle connections are opened through each and left idle.
cat > "$work/conns.py" <<'PY'
# conns.py idle PORT N: opens N connections through PORT, says "ready", holds them
#   until a line arrives on stdin.
# conns.py cycles PORT N PID CYCLES: opens and closes N connections CYCLES times;
#   prints PID's RSS per connection (KiB) while they are open and after they closed,
#   each read once the process's memory stopped moving.
import socket, sys, time

def open_relayed(port, n):
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
    return socks

def rss(pid):
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmRSS"):
            return int(line.split()[1])

def settle(pid):
    last, start = rss(pid), time.time()
    while time.time() - start < 8:
        time.sleep(1.2)
        now = rss(pid)
        if now == last:
            break
        last = now
    return last

mode, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if mode == "idle":
    socks = open_relayed(port, n)
    print("ready", flush=True)
    sys.stdin.readline()
else:
    pid, cycles = int(sys.argv[4]), int(sys.argv[5])
    base = settle(pid)
    for _ in range(cycles):
        socks = open_relayed(port, n)
        opened = settle(pid)
        for s in socks:
            s.close()
        closed = settle(pid)
        print("%.2f %.2f" % ((opened - base) / n, (closed - base) / n), flush=True)
PY
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
idle_cost() { # pid port -> KiB per connection
  local before after ready
  before=$(rss_kib "$1")
  coproc IDLE { python3 "$work/conns.py" idle "$2" "$idle"; }
  read -r ready <&"${IDLE[0]}" || { echo "bench: idle client failed" >&2; exit 1; }
  after=$(rss_kib "$1")
  echo done >&"${IDLE[1]}"
  wait "$IDLE_PID" || true
  awk -v a="$after" -v b="$before" -v n="$idle" 'BEGIN { printf "%.2f", (a - b) / n }'
}
printf 'idle connections…' >&2
snag_idle=$(idle_cost "$snag_pid" "$snag_port")
# A port scan while many sockets are open: 4 per idle connection relayed by snag.
coproc IDLE { python3 "$work/conns.py" idle "$snag_port" "$idle"; }
read -r _ <&"${IDLE[0]}"
scan_start=$(date +%s%N)
"$snag" ports --json > "$work/ports.json"
scan_ms=$(( ($(date +%s%N) - scan_start) / 1000000 ))
scan_sockets=$(python3 -c "import json,sys; print(sum(json.load(open(sys.argv[1]))['states'].values()))" "$work/ports.json")
echo done >&"${IDLE[1]}"
wait "$IDLE_PID" || true
hap_idle=$(idle_cost "$haproxy_pid" "$haproxy_port")

port[direct]=$nginx_port port[haproxy]=$haproxy_port port[haproxy_http]=$haproxy_http_port
port[nginx_proxy]=$nginx_proxy_port
port[haproxy_fault]=$haproxy_fault_port port[nginx_fault]=$nginx_fault_port

# Five open/close cycles of $idle connections through a snag under a fault, on a
# fresh process: KiB per connection while they are open, and still held after they
# closed, once the process's memory stopped moving.
printf '\ropen/close cycles under a fault…' >&2
mapfile -t cycles < <(python3 "$work/conns.py" cycles "${port[latency0]}" "$idle" "${pid_of[latency0]}" 5)
[ "${#cycles[@]}" -eq 5 ] || { echo "bench: the open/close cycles failed" >&2; exit 1; }
printf '\r%50s\r' '' >&2

# The allocators, each a plain build in a fresh process under the same fault: the
# cycles above, then requests/s and CPU per request at 32 connections, interleaved.
declare -A alloc_cycles
alloc_names=()
if [ "$allocators" = 1 ]; then
  for a in jemalloc glibc mimalloc; do
    alloc_names+=("$a")
    port[alloc_$a]=$(free_port)
    "$work/snag-$a" proxy --listen "127.0.0.1:${port[alloc_$a]}" --upstream "127.0.0.1:$nginx_port" --seed 1 \
      --fault latency:latency=0 >/dev/null 2>>"$work/snag.log" & pids+=($!)
    pid_of[alloc_$a]=$!
    wait_port "${port[alloc_$a]}"
    printf '\ropen/close cycles with %s…' "$a" >&2
    alloc_cycles[$a]=$(python3 "$work/conns.py" cycles "${port[alloc_$a]}" "$idle" "${pid_of[alloc_$a]}" 5 | tr '\n' ' ')
    printf '\r%50s\r' '' >&2
  done
fi

# wrk prints latencies as 1.23us/ms/s and transfer as 1.23KB/MB/GB (base 1024).
to_ms() { awk -v v="$1" 'BEGIN { n=v+0; if (v ~ /us$/) n/=1000; else if (v ~ /[0-9]s$/ && v !~ /ms$/) n*=1000; print n }'; }
to_mib() { awk -v v="$1" 'BEGIN { n=v+0; if (v ~ /GB$/) n*=1024; else if (v ~ /KB$/) n/=1024; else if (v ~ /[0-9]B$/) n/=1048576; print n }'; }

# CPU time (user + system, clock ticks) of a process and its children (nginx's
# workers), from /proc.
cpu_ticks() {
  local total=0 p
  for p in "$1" $(cat "/proc/$1/task/"*/children 2>/dev/null); do
    [ -r "/proc/$p/stat" ] || continue
    total=$((total + $(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$p/stat")))
  done
  echo "$total"
}
hz=$(getconf CLK_TCK)

run_wrk() { # target conns path -> "rps p50ms p99ms mibps cpu_us_per_request"
  local t=$1 c=$2 path=$3 threads=2
  [ "$c" -lt 2 ] && threads=1
  local out before=0 after=0 pid=${pid_of[$t]:-}
  [ -n "$pid" ] && before=$(cpu_ticks "$pid")
  out=$(wrk -t"$threads" -c"$c" -d"${duration}s" --latency "http://127.0.0.1:${port[$t]}$path")
  [ -n "$pid" ] && after=$(cpu_ticks "$pid")
  local rps p50 p99 tps
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  p50=$(to_ms "$(awk '$1=="50%" {print $2}' <<<"$out")")
  p99=$(to_ms "$(awk '$1=="99%" {print $2}' <<<"$out")")
  tps=$(to_mib "$(awk '/^Transfer\/sec/ {print $2}' <<<"$out")")
  # The 503s are the point of the fault targets; anything else is an error.
  if grep -q "Socket errors" <<<"$out" || { [[ "$t" != *_fault ]] && grep -q "Non-2xx" <<<"$out"; }; then
    echo "bench: wrk reported errors against $t:" >&2; grep "Socket errors\|Non-2xx" <<<"$out" >&2
  fi
  if [[ "$t" == *_fault ]]; then # each answers about 10% with 503, or it is not the anchor it claims
    awk '/requests in/ {n=$1} /^  Non-2xx/ {e=$NF} END {
      if (n < 200 || (e / n > 0.05 && e / n < 0.15)) exit 0
      printf "bench: %d of %d answers were not 2xx, not the 10%% the fault target should give\n", e, n; exit 1
    }' <<<"$out" >&2 || true
  fi
  local cpu="-"
  [ -n "$pid" ] && cpu=$(awk -v d="$((after - before))" -v hz="$hz" -v r="$rps" -v s="$duration" \
    'BEGIN { printf "%.1f", d / hz * 1e6 / (r * s) }')
  echo "$rps $p50 $p99 $tps $cpu"
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A res
cases=("1 /small" "32 /small" "256 /small" "1 /10m")
targets=(direct snag haproxy latency0 bandwidth slicer capture http http_fault haproxy_http nginx_proxy
  haproxy_fault nginx_fault)
total=$(( ${#cases[@]} * ${#targets[@]} * rounds ))
n=0 started=$(date +%s)
for round in $(seq "$rounds"); do
  for case in "${cases[@]}"; do
    for t in "${targets[@]}"; do
      n=$((n + 1))
      printf '\r[%3d/%3d, %4d s] round %d: %-12s %-18s' "$n" "$total" $(( $(date +%s) - started )) "$round" "$t" "c=${case% *} ${case#* }" >&2
      res["$t|$case|$round"]=$(run_wrk "$t" $case)
    done
  done
done
printf '\r%70s\r' '' >&2

col() { # target case field-index -> median over rounds
  for round in $(seq "$rounds"); do echo "${res["$1|$2|$round"]}" | awk -v f="$3" '{print $f}'; done | median
}
# A ratio of two targets, paired round by round: each round measured both a few
# seconds apart, so the median of the rounds' ratios follows what this host did
# then, where a ratio of two medians can pair a quiet minute with a busy one. With
# more than one round, the lowest and highest of the rounds' ratios follow it: a
# target met in the median but not in every round is within this host's noise.
ratio() { # target reference case field-index -> "0.93× 0.88–0.97"
  local round
  for round in $(seq "$rounds"); do
    awk -v f="$4" -v a="${res["$1|$3|$round"]}" -v b="${res["$2|$3|$round"]}" \
      'BEGIN { split(a, x, " "); split(b, y, " "); if (y[f] > 0) print x[f] / y[f] }'
  done | sort -g | awk '{ r[NR] = $1 } END {
    if (NR == 0) { print "–"; exit }
    printf "%.2f×", r[int((NR + 1) / 2)]
    if (NR > 1) printf " %.2f–%.2f", r[1], r[NR]
  }'
}
# A column's width, from its heading; a ratio's also fits its spread.
width() { local w=${#1} min=13; [ "$rounds" -gt 1 ] && min=16; echo $((w > min ? w : min)); }
# A cell right-aligned to a width in characters (printf counts the bytes of × and –).
pad() { local LC_ALL=C.UTF-8; printf ' %*s%s' $(($1 > ${#2} ? $1 - ${#2} : 0)) '' "$2"; }
# A table: title, reference target, then targets; one row per measure.
table() {
  local title=$1 ref=$2; shift 2
  local ts=("$@") t
  echo
  echo "$title"
  printf '%-24s' "measure"
  for t in "${ts[@]}"; do printf ' %13s' "$t"; done
  for t in "${ts[@]}"; do [ "$t" != "$ref" ] && printf ' %*s' "$(width "$t/$ref")" "$t/$ref"; done
  echo
  row() { # label format case field [higher-is-better]
    local label=$1 fmt=$2 case=$3 f=$4 v
    declare -A val
    printf '%-24s' "$label"
    for t in "${ts[@]}"; do val[$t]=$(col "$t" "$case" "$f"); printf ' %13s' "$(printf "$fmt" "${val[$t]}")"; done
    for t in "${ts[@]}"; do
      [ "$t" != "$ref" ] && pad "$(width "$t/$ref")" "$(ratio "$t" "$ref" "$case" "$f")"
    done
    echo
  }
  for c in 1 32 256; do
    row "requests/s, $c conn" "%.0f /s" "$c /small" 1
    row "p99 latency, $c conn" "%.3f ms" "$c /small" 3
  done
  row "bulk 10 MiB, 1 conn" "%.0f MiB/s" "1 /10m" 4
  printf '%-24s' "CPU per request, 32 conn"
  for t in "${ts[@]}"; do
    local cpu; cpu=$(col "$t" "32 /small" 5)
    if [ "$cpu" = "-" ] || [ -z "$cpu" ]; then pad 13 "–"; else pad 13 "$(printf '%.1f µs' "$cpu")"; fi
  done
  echo
}

echo
echo "snag benchmark: wrk → target → nginx on 127.0.0.1, ${duration} s runs, median of $rounds, $(nproc) cores"
[ "$rounds" -gt 1 ] && echo "each ratio: the median of the rounds' own ratios, then the lowest–highest of them"
table "Passthrough, against a direct connection and HAProxy mode tcp (targets: snag/direct ≈ hap/direct)" \
  direct direct snag haproxy
table "Faults whose effect is nil, and capture, against snag without them (target: ≥ 0.90×; capture ≥ 0.85× at 32 conn and bulk)" \
  snag snag latency0 bandwidth slicer capture
table "HTTP mode, against HAProxy mode http and nginx proxy_pass with keep-alive (target: snag requests/s and p99 at least theirs at 32 and 256 conn)" \
  direct direct http haproxy_http nginx_proxy
table "HTTP mode with http_status 503 at toxicity 0.1, against HAProxy and nginx answering 10% with 503 themselves (same target)" \
  direct direct http_fault haproxy_fault nginx_fault

# Timing, seen by a client's own clock through snag to a small upstream of its own:
# round trips of one byte with latency=1 against without; the gaps between the
# pieces of a 64 KiB block with slicer delay=200 µs; the rate of bandwidth=500 KB/s.
# The anchor for latency: the upstream itself waiting 1 ms before each echo (a
# sleep with no timer slack) behind the same passthrough, which is what a 1 ms wait
# in this chain costs on this host; a VM whose idle vCPUs halt wakes late.
cat > "$work/timing.py" <<'PY'
import ctypes, socket, sys, threading, time
mode, proxy, upstream, arg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
size = int(sys.argv[5]) if len(sys.argv) > 5 else 0
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", upstream))
srv.listen(8)
def serve():
    c, _ = srv.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if mode in ("rtt", "rtt_sleep"):
        ctypes.CDLL(None).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK: 1 ns
        while True:
            d = c.recv(64)
            if not d:
                return
            if mode == "rtt_sleep":
                time.sleep(0.001)
            c.sendall(d)
    c.recv(16)
    c.sendall(b"x" * size)
    c.close()
threading.Thread(target=serve, daemon=True).start()
cl = socket.create_connection(("127.0.0.1", proxy))
cl.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
if mode in ("rtt", "rtt_sleep"):  # ARG round trips: p50 and p99 in µs
    rtts = []
    for _ in range(int(arg)):
        t = time.perf_counter_ns()
        cl.sendall(b"p")
        if not cl.recv(64):
            sys.exit("bench: the round-trip connection closed")
        rtts.append((time.perf_counter_ns() - t) / 1000)
    rtts = sorted(rtts[50:])
    print("%.1f %.1f" % (rtts[len(rtts) // 2], rtts[len(rtts) * 99 // 100]))
    sys.exit(0)
cl.sendall(b"go")
marks = []
while True:
    d = cl.recv(1 << 20)
    t = time.perf_counter_ns()
    if not d:
        break
    marks.append((t, len(d)))
if mode == "gaps":  # ARG µs expected: share of gaps within ±50 µs, p10/p50/p90, pieces
    gaps = sorted((b[0] - a[0]) / 1000 for a, b in zip(marks, marks[1:]))
    ok = sum(1 for g in gaps if abs(g - arg) <= 50) / len(gaps)
    print("%.1f %.0f %.0f %.0f %d" % (100 * ok, gaps[len(gaps) // 10], gaps[len(gaps) // 2], gaps[len(gaps) * 9 // 10], len(marks)))
else:  # rate: bytes after the first piece over the time they took, B/s
    span = (marks[-1][0] - marks[0][0]) / 1e9
    print("%.0f %.2f" % (sum(l for _, l in marks[1:]) / span, span))
PY
timed() { # fault args… -> runs timing.py through a fresh snag with the fault
  local mode=$1 arg=$2 size=$3; shift 3
  local up lp pid out
  up=$(free_port) lp=$(free_port)
  "$snag" proxy --listen "127.0.0.1:$lp" --upstream "127.0.0.1:$up" --seed 1 "$@" >/dev/null 2>>"$work/timed.log" &
  pid=$!; pids+=($pid)
  wait_port "$lp"
  out=$(python3 "$work/timing.py" "$mode" "$lp" "$up" "$arg" "$size")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  echo "$out"
}
base=() lat=() slept=() gaps=() rate=()
for round in $(seq "$rounds"); do
  printf '\rtiming round %d/%d…' "$round" "$rounds" >&2
  base+=("$(timed rtt 2000 0)")
  lat+=("$(timed rtt 2000 0 --fault latency:latency=1)")
  slept+=("$(timed rtt_sleep 2000 0)")
  gaps+=("$(timed gaps 200 65536 --fault slicer:average_size=64,size_variation=0,delay=200)")
  rate+=("$(timed rate 0 550000 --fault bandwidth:rate=500)")
done
printf '\r%40s\r' '' >&2
pick() { printf '%s\n' "${@:2}" | awk -v f="$1" '{print $f}' | median; }
echo
echo "Timing, by the client's clock (median of $rounds)"
awk -v b50="$(pick 1 "${base[@]}")" -v b99="$(pick 2 "${base[@]}")" -v l50="$(pick 1 "${lat[@]}")" -v l99="$(pick 2 "${lat[@]}")" \
  'BEGIN { printf "  latency=1 adds        %.3f ms at p50, %.3f ms at p99 (round trips: %.0f/%.0f µs without, %.0f/%.0f µs with; target 1.00 ± 0.10 and ± 0.30 ms)\n", (l50 - b50) / 1000, (l99 - b99) / 1000, b50, b99, l50, l99 }'
awk -v b50="$(pick 1 "${base[@]}")" -v b99="$(pick 2 "${base[@]}")" -v s50="$(pick 1 "${slept[@]}")" -v s99="$(pick 2 "${slept[@]}")" \
  'BEGIN { printf "    anchor              %.3f ms at p50, %.3f ms at p99 with the upstream sleeping 1 ms itself before each echo instead: what a 1 ms wait in this chain costs on this host\n", (s50 - b50) / 1000, (s99 - b99) / 1000 }'
printf '  slicer delay=200 µs   %s%% of gaps within 200 ± 50 µs (p10 %s, p50 %s, p90 %s µs over %s pieces; target ≥ 90%%)\n' \
  "$(pick 1 "${gaps[@]}")" "$(pick 2 "${gaps[@]}")" "$(pick 3 "${gaps[@]}")" "$(pick 4 "${gaps[@]}")" "$(pick 5 "${gaps[@]}")"
awk -v r="$(pick 1 "${rate[@]}")" -v s="$(pick 2 "${rate[@]}")" \
  'BEGIN { printf "  bandwidth=500 KB/s    %.0f B/s over %.2f s: %+.2f%% (target within ± 2%%)\n", r, s, (r / 500000 - 1) * 100 }'

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
echo
awk -v g="$gen_rps" -v w="$ref_rps" 'BEGIN { printf "load generator, closed loop: snag load %.0f req/s against wrk %.0f at 32 conn: %.2f× (target ≥ 0.9×)\n", g, w, g / w }'
for rate in 5000 10000 20000 40000; do
  "$snag" load "http://127.0.0.1:$nginx_port/small" --rate "$rate" -d "${duration}s" --deadline 1s --json |
    python3 -c 'import json,sys
r = json.load(sys.stdin)
print("load generator, open loop %6d/s: offered %d, sent %d (%.2f%%), ok %d, p99 %s ms" % (
    int(sys.argv[1]), r["offered"], r["sent"], 100.0 * r["sent"] / r["offered"], r["ok"], r["latency_ms"]["p99"]))' "$rate"
done

echo
echo "Memory ($idle connections, each relayed one request first)"
echo "  idle, no fault: snag ${snag_idle} KiB each, haproxy ${hap_idle} KiB each (target: about HAProxy's)"
printf '  under latency=0, 5 open/close cycles, KiB per connection open / after close:'
for c in "${cycles[@]}"; do printf '  %s' "${c/ / \/ }"; done
echo
awk -v open="${cycles[0]% *}" -v last="${cycles[4]#* }" \
  'BEGIN { printf "  idle under a fault %.2f KiB (target ≤ 4), held after the fifth close %.2f KiB (target ≤ 1)\n", open, last }'
if [ "$allocators" = 1 ]; then
  for round in $(seq "$rounds"); do
    for a in "${alloc_names[@]}"; do
      printf '\rallocators round %d/%d: %s…' "$round" "$rounds" "$a" >&2
      res["alloc_$a|32 /small|$round"]=$(run_wrk "alloc_$a" 32 /small)
    done
  done
  printf '\r%50s\r' '' >&2
  echo
  echo "Allocators, plain builds under latency=0 ($idle connections; requests/s and CPU at 32 connections)"
  printf '  %-9s %13s %15s %15s %13s %15s\n' allocator "idle KiB/conn" "held, 1st close" "held, 5th close" "requests/s" "CPU/request"
  for a in "${alloc_names[@]}"; do
    read -r -a c <<<"${alloc_cycles[$a]}"
    printf '  %-9s %13s %15s %15s %13s %15s\n' "$a" "${c[0]}" "${c[1]}" "${c[9]}" \
      "$(printf '%.0f /s' "$(col "alloc_$a" "32 /small" 1)")" "$(printf '%.1f µs' "$(col "alloc_$a" "32 /small" 5)")"
  done
fi
echo "port scan: snag ports read $scan_sockets sockets in $scan_ms ms, process start included (target: 30,000 in under 100 ms)"
