# Sourced by scripts/bench.sh and scripts/pgo.sh: a work directory that goes, with
# the processes started into `pids`, when the script exits; ports on 127.0.0.1.
#   loopback_setup NAME   # $work=/tmp/snag-NAME.XXXXXX; errors say "NAME:"
loopback_setup() {
  who=$1
  work=$(mktemp -d "/tmp/snag-$who.XXXXXX")
  chmod 755 "$work" # nginx workers run as www-data and must read www/
  pids=()
  trap loopback_cleanup EXIT
  ulimit -n "$(ulimit -Hn)"
}
loopback_cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { # port: wait up to 10 s for something to accept on it
  for _ in $(seq 100); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1',$1),0.1)" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "$who: nothing listens on port $1 after 10 s" >&2
  cat "$work/snag.log" >&2 2>/dev/null
  exit 1
}
