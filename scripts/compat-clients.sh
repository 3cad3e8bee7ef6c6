#!/usr/bin/env bash
# Drives `snag serve` with Toxiproxy's own client libraries, as a user switching from
# Toxiproxy would: toxiproxy-python (PyPI) and toxiproxy-node-client (npm), installed
# into a scratch folder. Each script creates a proxy, adds, updates and removes a
# latency toxic while timing HTTP requests through it, disables and re-enables the
# proxy, populates, resets and deletes. Needs python3 with pip, node with npm.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/snag-clients.XXXXXX)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
(cd "$root" && cargo build --release -q)
python3 -m pip install -q --target "$work/py" toxiproxy-python future requests
(cd "$work" && npm init -y >/dev/null && npm install -q toxiproxy-node-client@4 >/dev/null)

mkdir -p "$work/www" && printf 'hello from the upstream\n' > "$work/www/index.html"
up_port=$(free_port)
python3 -m http.server "$up_port" --bind 127.0.0.1 --directory "$work/www" >/dev/null 2>&1 & pids+=($!)
api_port=$(free_port)
coproc API { exec "$root/target/release/snag" serve --listen "127.0.0.1:$api_port" --seed 1; }
pids+=("$API_PID")
read -r _ <&"${API[0]}" # the "control API on …" line: it is listening
for _ in $(seq 50); do python3 -c "import socket; socket.create_connection(('127.0.0.1',$up_port),0.1)" 2>/dev/null && break; sleep 0.1; done

export API_PORT=$api_port UPSTREAM=127.0.0.1:$up_port
echo "== toxiproxy-python"
PYTHONPATH="$work/py" python3 "$root/scripts/compat/python_client.py"
echo "== toxiproxy-node-client"
NODE_PATH="$work/node_modules" node "$root/scripts/compat/node_client.js"
