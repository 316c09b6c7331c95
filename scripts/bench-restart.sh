#!/usr/bin/env bash
# Restart cost of `allot serve`: queue N workloads through the API (gangs no node can hold, so
# they stay pending and every cycle looks at all of them), stop cleanly, restart, and time
# until the daemon listens again — with snapshots (the default interval) and without (an
# interval no run reaches, so the whole log is replayed).
# Also prints the time one snapshot took (the daemon's allot_snapshot_seconds).
# Usage: scripts/bench-restart.sh [N]   (needs a release build: cargo build --release -p allot)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-10000}
BIN=target/release/allot
PORT=${ALLOT_BENCH_PORT:-7398}
URL=http://127.0.0.1:$PORT
[ -x $BIN ] || { echo "build first: cargo build --release -p allot" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'kill $(cat $WORK/pid 2>/dev/null) 2>/dev/null || true; rm -rf $WORK' EXIT

start_daemon() { # $1: snapshot interval; prints seconds until it listens
  local t0=$(date +%s.%N)
  $BIN serve --data-dir $WORK/data --listen 127.0.0.1:$PORT --snapshot-every $1 \
    > $WORK/out 2> $WORK/err &
  echo $! > $WORK/pid
  for _ in $(seq 6000); do grep -q "listening on" $WORK/err 2>/dev/null && break; sleep 0.05; done
  local t1=$(date +%s.%N)
  python3 -c "print(f'{$t1 - $t0:.2f}')"
}

stop_daemon() { kill $(cat $WORK/pid); wait $(cat $WORK/pid) 2>/dev/null || true; }

for every in 10000 1000000000; do
  rm -rf $WORK/data
  start_daemon $every > /dev/null
  TOKEN=$(grep allot_ $WORK/out)
  seq $N | xargs -P 8 -I{} curl -s -o /dev/null -X POST -H "Authorization: Bearer $TOKEN" \
    -H 'Content-Type: application/json' \
    -d '{"project": "research", "gpus": 8, "members": 64, "same_node": true, "command": ["true"]}' \
    $URL/api/v1/workloads
  sleep 2
  curl -s -H "Authorization: Bearer $TOKEN" $URL/metrics | grep -E "^allot_snapshot_seconds_(sum|count)" | tr '\n' ' ' || true
  echo
  stop_daemon
  records=$(python3 -c "import sqlite3; c=sqlite3.connect('$WORK/data/allot.db'); print(c.execute('select count(*) from log').fetchone()[0], c.execute('select coalesce(max(seq),0) from snapshots').fetchone()[0], c.execute('select max(seq) from log').fetchone()[0])")
  secs=$(start_daemon $every)
  replayed=$(grep -o "[0-9]* log entries replayed" $WORK/err | head -1 || true)
  echo "snapshot every $every: log records kept / latest snapshot seq / last seq: $records; restart ${secs}s ($replayed)"
  grep -i "snapshot" $WORK/err || true
  stop_daemon
done
