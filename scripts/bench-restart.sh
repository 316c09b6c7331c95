#!/usr/bin/env bash
# Restart cost of `allot serve`: queue N workloads through the API (gangs no node can hold, so
# they stay pending and every cycle looks at all of them), stop cleanly, restart, and time
# until the daemon listens again — with snapshots (the default interval) and without (an
# interval no run reaches, so the whole log is replayed).
# Also prints the time one snapshot took (the daemon's allot_snapshot_seconds).
# With ALLOT_BENCH_TELEMETRY=1, telemetry is on as people run it: a dcgm-exporter page (the
# shared fixture's real lines, relabelled to the example inventory's devices) is served on
# loopback and read by `--telemetry dcgm-exporter=URL`, 20 one-GPU workloads run (sampled every
# telemetry round) before the N pending gangs are queued, and the daemon runs a minute more
# so that the log holds telemetry rounds.
# Usage: scripts/bench-restart.sh [N]   (needs a release build: cargo build --release -p allot)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-10000}
BIN=target/release/allot
PORT=${ALLOT_BENCH_PORT:-7398}
URL=http://127.0.0.1:$PORT
[ -x $BIN ] || { echo "build first: cargo build --release -p allot" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'kill $(cat $WORK/pid 2>/dev/null) $(cat $WORK/exporter.pid 2>/dev/null) 2>/dev/null || true; rm -rf $WORK' EXIT
TELEMETRY=()
if [ "${ALLOT_BENCH_TELEMETRY:-0}" = 1 ]; then
  mkdir -p $WORK/exporter
  python3 - "$WORK/exporter/metrics" <<'PY'
import re, sys
fixture = open("../shared/fixtures/dcgm-exporter-sample.txt").read().splitlines()
engine = next(l for l in fixture if l.startswith("DCGM_FI_PROF_GR_ENGINE_ACTIVE{") and 'Hostname="l40s.example.com"' in l)
def relabel(line, node, gpu, value):
    labels = line.rsplit(" ", 1)[0]
    labels = re.sub(r'([{,])gpu="[^"]*"', rf'\1gpu="{gpu}"', labels)
    labels = re.sub(r'device="[^"]*"', f'device="nvidia{gpu}"', labels)
    labels = re.sub(r'Hostname="[^"]*"', f'Hostname="{node}"', labels)
    return f"{labels} {value}"
devices = [("h100-0", 8), ("h100-1", 8), ("a100-0", 4), ("a100-1", 4), ("v100-0", 4), ("l4-0", 2)]
out = ["# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge"]
for node, n in devices:
    for g in range(n):
        out.append(relabel(engine, node, g, "0.610000" if g % 2 else "0.020000"))
open(sys.argv[1], "w").write("\n".join(out) + "\n")
PY
  EXPORTER_PORT=$((PORT + 1))
  (cd $WORK/exporter && exec python3 -m http.server $EXPORTER_PORT --bind 127.0.0.1 > /dev/null 2>&1) &
  echo $! > $WORK/exporter.pid
  TELEMETRY=(--telemetry "dcgm-exporter=http://127.0.0.1:$EXPORTER_PORT/metrics")
fi

start_daemon() { # $1: snapshot interval; prints seconds until it listens
  # Emptied here, not by the background job's redirection: that may come after the first
  # look for "listening on" and let the last run's lines answer it.
  : > $WORK/err
  local t0=$(date +%s.%N)
  $BIN serve --single-user --data-dir $WORK/data --listen 127.0.0.1:$PORT --snapshot-every $1 \
    "${TELEMETRY[@]}" > $WORK/out 2> $WORK/err &
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
  if [ ${#TELEMETRY[@]} -gt 0 ]; then
    for p in vision nlp; do
      for _ in $(seq 10); do
        curl -s -o /dev/null -X POST -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
          -d "{\"project\": \"$p\", \"gpus\": 1, \"command\": [\"sleep\", \"100000\"]}" $URL/api/v1/workloads
      done
    done
  fi
  seq $N | xargs -P 8 -I{} curl -s -o /dev/null -X POST -H "Authorization: Bearer $TOKEN" \
    -H 'Content-Type: application/json' \
    -d '{"project": "research", "gpus": 8, "members": 64, "same_node": true, "command": ["true"]}' \
    $URL/api/v1/workloads
  sleep 2
  if [ ${#TELEMETRY[@]} -gt 0 ]; then
    sleep 60
    curl -s -H "Authorization: Bearer $TOKEN" $URL/metrics | grep -E "^allot_measured_gpus" | tr '\n' ' ' || true
    echo
  fi
  curl -s -H "Authorization: Bearer $TOKEN" $URL/metrics | grep -E "^allot_snapshot_seconds_(sum|count)" | tr '\n' ' ' || true
  echo
  stop_daemon
  records=$(python3 -c "import sqlite3; c=sqlite3.connect('$WORK/data/allot.db'); print(c.execute('select count(*) from log').fetchone()[0], c.execute('select coalesce(max(seq),0) from snapshots').fetchone()[0], c.execute('select max(seq) from log').fetchone()[0], 'sampled entries:', c.execute(\"select count(*) from log where kind='sampled'\").fetchone()[0])")
  secs=$(start_daemon $every)
  replayed=$(grep -o "[0-9]* log entries replayed" $WORK/err | head -1 || true)
  echo "snapshot every $every: log records kept / latest snapshot seq / last seq: $records; restart ${secs}s ($replayed)"
  grep -i "snapshot" $WORK/err || true
  stop_daemon
  # Processes of the telemetry mode's running workloads.
  pkill -f "sleep 100000" 2>/dev/null || true
done
