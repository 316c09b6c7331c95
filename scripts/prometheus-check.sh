#!/usr/bin/env bash
# Real Prometheus check: Debian's `prometheus` on loopback scrapes the shared fixture files
# (dcgm-exporter and AMD device-metrics-exporter outputs, each its own job and metrics_path,
# served by python3 -m http.server), and allot's Prometheus source must read back the same
# samples as the direct parsers (crates/allot-telemetry/tests/prometheus_live.rs).
#
# Usage: scripts/prometheus-check.sh    (root, or sudo; installs `prometheus` with apt if missing)
# Env:
#   PROM_PORT (19090), FIXTURE_PORT (19101)
#   ALLOT_METRICS_TARGET  host:port of a running `allot serve` to scrape as job `allot` too
#   ALLOT_METRICS_TOKEN   bearer token for it (written to a 0600 file, never into the config)
#   ALLOT_METRICS_SCHEME  http (default) or https
# Everything started here is stopped by pid on exit; nothing listens beyond 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
PROM_PORT=${PROM_PORT:-19090}
FIXTURE_PORT=${FIXTURE_PORT:-19101}
FIXTURES=../shared/fixtures
for f in dcgm-exporter-sample.txt amd-device-metrics-exporter-sample.txt; do
  [ -f "$FIXTURES/$f" ] || { echo "missing $FIXTURES/$f (the shared folder must sit beside the clone)" >&2; exit 1; }
done

if ! command -v prometheus > /dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  # policy-rc.d (exit 101) keeps the package's postinst from starting the service.
  CREATED_POLICY=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d > /dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    CREATED_POLICY=1
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends prometheus > /dev/null
  [ -n "$CREATED_POLICY" ] && $SUDO rm -f /usr/sbin/policy-rc.d
fi
command -v curl > /dev/null || { echo "curl is missing: apt-get install curl" >&2; exit 1; }

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2> /dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2> /dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# The fixture endpoint: each file at its own path.
mkdir -p "$WORK/www" "$WORK/tsdb"
cp "$FIXTURES/dcgm-exporter-sample.txt" "$WORK/www/dcgm.txt"
cp "$FIXTURES/amd-device-metrics-exporter-sample.txt" "$WORK/www/amd.txt"
python3 -m http.server "$FIXTURE_PORT" --bind 127.0.0.1 --directory "$WORK/www" \
  > "$WORK/http.log" 2>&1 &
PIDS+=($!)

# The config: one job per fixture; further targets are appended as jobs of their own.
write_config() {
  cat <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: dcgm
    metrics_path: /dcgm.txt
    static_configs:
      - targets: ['127.0.0.1:$FIXTURE_PORT']
  - job_name: amd
    metrics_path: /amd.txt
    static_configs:
      - targets: ['127.0.0.1:$FIXTURE_PORT']
YAML
  if [ -n "${ALLOT_METRICS_TARGET:-}" ]; then
    cat <<YAML
  - job_name: allot
    scheme: ${ALLOT_METRICS_SCHEME:-http}
    metrics_path: /metrics
    static_configs:
      - targets: ['$ALLOT_METRICS_TARGET']
YAML
    if [ -n "${ALLOT_METRICS_TOKEN:-}" ]; then
      (umask 077; printf '%s' "$ALLOT_METRICS_TOKEN" > "$WORK/allot.token")
      cat <<YAML
    authorization:
      type: Bearer
      credentials_file: $WORK/allot.token
YAML
    fi
  fi
}
write_config > "$WORK/prometheus.yml"
promtool check config "$WORK/prometheus.yml" > /dev/null

prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
  --web.listen-address="127.0.0.1:$PROM_PORT" < /dev/null > "$WORK/prometheus.log" 2>&1 &
PIDS+=($!)
URL="http://127.0.0.1:$PROM_PORT"

# Wait (up to 60 s) until every job has been scraped successfully once. Target discovery alone
# takes ~5 s; a scrape is atomic, so up == 1 means all of a fixture's series are stored.
JOBS="dcgm amd"
[ -n "${ALLOT_METRICS_TARGET:-}" ] && JOBS="$JOBS allot"
for job in $JOBS; do
  for i in $(seq 300); do
    if curl -sf "$URL/api/v1/query" --data-urlencode "query=up{job=\"$job\"}" | grep -q '"1"\]'; then
      break
    fi
    if [ "$i" = 300 ]; then
      echo "job $job was not scraped successfully within 60 s; targets:" >&2
      curl -s "$URL/api/v1/targets" >&2 || true
      tail -20 "$WORK/prometheus.log" >&2
      exit 1
    fi
    sleep 0.2
  done
  echo "prometheus: job $job scraped"
done
# Two more scrapes, so the range query's 10 s window has points at each step.
sleep 10

ALLOT_PROMETHEUS_URL=$URL cargo test --locked -p allot-telemetry --test prometheus_live -- --nocapture
echo "prometheus check: ok"
