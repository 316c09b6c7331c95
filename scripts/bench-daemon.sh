#!/usr/bin/env bash
# Load benchmark of `allot serve` on loopback with wrk (Debian's `wrk`):
#   submit-to-admit latency (the daemon's own histogram, from a submission's arrival at the API
#   to the cycle that admitted it) and sustained submissions/s at a paced 500/s, with 100 and
#   1,000 workloads queued; then daemon RSS with 10,000 workloads.
# Usage: scripts/bench-daemon.sh [RATE_PER_S] [SECONDS]   (needs a release build: cargo build --release -p allot)
#   RATE_PER_S 0: no pacing (as fast as 50 connections go). wrk's pacing waits after each answer,
#   so the rate reached is a little below the one asked; it is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-500}
SECONDS_RUN=${2:-30}
BIN=target/release/allot
PORT=${ALLOT_BENCH_PORT:-7399}
URL=http://127.0.0.1:$PORT
command -v wrk >/dev/null || { echo "wrk is missing: apt-get install wrk" >&2; exit 1; }
[ -x $BIN ] || { echo "build first: cargo build --release -p allot" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'kill $(cat $WORK/pid 2>/dev/null) 2>/dev/null || true; pkill -f "allot-bench-marker" 2>/dev/null || true; rm -rf $WORK' EXIT

start_daemon() {
  rm -rf $WORK/data
  $BIN serve --single-user --data-dir $WORK/data --listen 127.0.0.1:$PORT > $WORK/out 2> $WORK/err &
  echo $! > $WORK/pid
  for _ in $(seq 100); do grep -q allot_ $WORK/out 2>/dev/null && break; sleep 0.1; done
  TOKEN=$(grep allot_ $WORK/out)
}

stop_daemon() { kill $(cat $WORK/pid); wait $(cat $WORK/pid) 2>/dev/null || true; }

# Workloads that stay queued: a gang no node can hold (pending, never placeable).
queue() {
  seq $1 | xargs -P 8 -I{} curl -s -o /dev/null -X POST -H "Authorization: Bearer $TOKEN" \
    -H 'Content-Type: application/json' \
    -d '{"project": "research", "gpus": 8, "members": 64, "same_node": true, "command": ["true"]}' \
    $URL/api/v1/workloads
}

metric() { curl -s -H "Authorization: Bearer $TOKEN" $URL/metrics; }

# p50/p99 of a histogram from the bucket counts of two scrapes (upper bucket bounds).
quantiles() {
  python3 - "$1" "$2" <<'PY'
import re, sys
def buckets(path):
    out = {}
    for line in open(path):
        m = re.match(r'allot_submit_to_admit_seconds_bucket\{le="([^"]+)"\} (\d+)', line)
        if m: out[m.group(1)] = int(m.group(2))
    return out
a, b = buckets(sys.argv[1]), buckets(sys.argv[2])
les = sorted((float('inf') if k == '+Inf' else float(k), k) for k in b)
total = b['+Inf'] - a.get('+Inf', 0)
res = []
for q in (0.5, 0.99):
    for v, k in les:
        if b[k] - a.get(k, 0) >= q * total:
            res.append(f"p{int(q*100)} ≤ {v*1000:.1f} ms")
            break
print(f"admitted {total}; " + ", ".join(res))
PY
}

cat > $WORK/submit.lua <<LUA
-- Paced submissions: each connection waits so that all together send about $RATE/s.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer TOKEN"
wrk.body = '{"project": "vision", "gpus": 0, "kind": "batch", "command": ["true", "allot-bench-marker"]}'
local conns = 50
local rate = $RATE
if rate > 0 then
  function delay() return 1000 * conns / rate end
end
function done(summary, latency, requests)
  io.write(string.format("wrk: %d requests, %d errors (connect %d, read %d, write %d, status %d, timeout %d)\n",
    summary.requests, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.status + summary.errors.timeout,
    summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.status, summary.errors.timeout))
  io.write(string.format("wrk: %.1f submissions/s; request latency p50 %.2f ms, p99 %.2f ms, max %.2f ms\n",
    summary.requests / (summary.duration / 1e6), latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000))
end
LUA

for QUEUED in 100 1000; do
  start_daemon
  sed -i "s/Bearer [A-Za-z0-9_]*\"/Bearer $TOKEN\"/" $WORK/submit.lua
  queue $QUEUED
  sleep 1
  metric > $WORK/before
  echo "== $QUEUED workloads queued, paced at $RATE submissions/s (0: unpaced) for ${SECONDS_RUN}s =="
  wrk -t2 -c50 -d${SECONDS_RUN}s -s $WORK/submit.lua $URL/api/v1/workloads | grep '^wrk:'
  sleep 1
  metric > $WORK/after
  echo -n "submit-to-admit: "; quantiles $WORK/before $WORK/after
  grep -E '^allot_workloads\{state="pending"\}' $WORK/after || true
  stop_daemon
done

echo "== RSS with 10,000 workloads =="
start_daemon
RSS0=$(awk '/VmRSS/ {print $2}' /proc/$(cat $WORK/pid)/status)
queue 10000
sleep 2
RSS=$(awk '/VmRSS/ {print $2}' /proc/$(cat $WORK/pid)/status)
COUNT=$(curl -s -H "Authorization: Bearer $TOKEN" $URL/api/v1/workloads | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["workloads"]))')
echo "daemon RSS: $((RSS0 / 1024)) MiB empty, $((RSS / 1024)) MiB with $COUNT workloads"
stop_daemon
