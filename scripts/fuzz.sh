#!/usr/bin/env bash
# Runs the cargo-fuzz targets in fuzz/ for a while each and reports executions and
# crashes. Usage: scripts/fuzz.sh [--seconds N] [TARGET ...]   (default: 60 s, all)
# The committed seeds (fuzz/seeds/TARGET) are read, never written: what a run finds
# goes to fuzz/corpus/TARGET. A crash leaves its input in fuzz/artifacts/TARGET and
# makes the script fail.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=60
targets=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --seconds) seconds="$2"; shift 2 ;;
        -h|--help) sed -n 2,6p "$0"; exit 0 ;;
        *) targets+=("$1"); shift ;;
    esac
done
[[ ${#targets[@]} -gt 0 ]] || targets=(fault_spec fault_file api_json http_bytes upstream_bytes capture)
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz (once)"
    cargo install cargo-fuzz --locked --quiet
fi
# libFuzzer's instrumentation needs flags that stable rustc takes only this way; no
# sanitizer, as the crate has no unsafe code, but with overflow checks and asserts.
export RUSTC_BOOTSTRAP=1
flags=(--sanitizer none --release --debug-assertions)
build_log=$(mktemp)
if ! cargo fuzz build "${flags[@]}" >"$build_log" 2>&1; then
    tail -n 40 "$build_log"
    exit 1
fi
rm -f "$build_log"
# The targets that need files make them under the temporary directory: one of
# this run's own, removed when it ends.
scratch=$(mktemp -d /tmp/snag-fuzz.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
failed=0
printf '%-14s %8s %14s %10s %8s\n' target seconds executions "exec/s" crashes
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    log=$(mktemp)
    if TMPDIR="$scratch" cargo fuzz run "${flags[@]}" "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 >"$log" 2>&1; then
        crashes=0
    else
        crashes=1
        failed=1
    fi
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || true)
    execs=$(sed -E 's/^#([0-9]+).*/\1/' <<<"$done_line")
    rate=$(grep -oE 'exec/s: [0-9]+' <<<"$done_line" | grep -oE '[0-9]+' || true)
    printf '%-14s %8s %14s %10s %8s\n' "$t" "$seconds" "${execs:-?}" "${rate:-?}" "$crashes"
    if [[ $crashes -ne 0 ]]; then
        echo "--- $t failed; its log:"
        grep -vE '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse)' "$log" | tail -n 60
    fi
    rm -f "$log"
done
exit $failed
