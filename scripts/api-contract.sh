#!/usr/bin/env bash
# The OpenAPI document is the API's contract: schemathesis (PyPI) generates requests from
# /api/v1/openapi.json — valid ones, and ones that break the schema — against a real
# `allot serve` on loopback, and fails on any 5xx, any response the document does not
# describe, a valid request refused or an invalid one accepted.
#
# Usage: scripts/api-contract.sh [ALLOT_BINARY]   (default target/release/allot)
# Env:
#   CONTRACT_SECONDS  time budget of the run (default 180)
#   CONTRACT_PORT     loopback port of the daemon (default 7391)
#   CONTRACT_SEED     schemathesis' seed (default 2025), so a failure can be replayed
# The daemon runs the generated workloads with the local backend, so as root it runs as
# `nobody` in a scratch directory. Report: target/ci-output/schemathesis/.
set -euo pipefail
cd "$(dirname "$0")/.."
ALLOT=$(realpath "${1:-target/release/allot}")
SECONDS_BUDGET=${CONTRACT_SECONDS:-180}
PORT=${CONTRACT_PORT:-7391}
SEED=${CONTRACT_SEED:-2025}
# Pinned so a new schemathesis release cannot change what CI checks without a commit.
SCHEMATHESIS=schemathesis==4.32.5
VENV=target/schemathesis-venv
REPORT=target/ci-output/schemathesis

if [ ! -x "$VENV/bin/schemathesis" ]; then
  if ! python3 -m venv --help > /dev/null 2>&1 || ! python3 -c 'import ensurepip' 2> /dev/null; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
      --no-install-recommends python3-venv > /dev/null
  fi
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "$SCHEMATHESIS"
fi

WORK=$(mktemp -d)
SERVE_PID=""
cleanup() {
  local status=$?
  if [ -n "$SERVE_PID" ]; then kill "$SERVE_PID" 2> /dev/null; wait "$SERVE_PID" 2> /dev/null; fi
  rm -rf "$WORK"
  exit $status
}
trap cleanup EXIT
AS=()
if [ "$(id -u)" -eq 0 ]; then
  chmod 755 "$WORK"
  chown nobody "$WORK"
  # setpriv execs the daemon in place, so SERVE_PID is the daemon itself.
  AS=(setpriv --reuid=nobody --regid=nogroup --clear-groups --)
fi
# The binary must be readable by `nobody`: copy it into the scratch directory.
cp "$ALLOT" "$WORK/allot"
chmod 755 "$WORK/allot"
"${AS[@]}" "$WORK/allot" serve --single-user --data-dir "$WORK/data" --workload-dir "$WORK/w" \
  --listen 127.0.0.1:$PORT > "$WORK/serve.out" 2> "$WORK/serve.err" &
SERVE_PID=$!
for _ in $(seq 200); do grep -q '^allot_' "$WORK/serve.out" 2> /dev/null && break; sleep 0.1; done
TOKEN=$(grep -m1 '^allot_' "$WORK/serve.out" || true)
[ -n "$TOKEN" ] || { echo "the daemon printed no admin token:" >&2; cat "$WORK/serve.err" >&2; exit 1; }

mkdir -p "$REPORT"
# One worker: CPython 3.11's AST builder keeps its recursion depth per interpreter, not per
# thread, so hypothesis parsing lambda sources in two threads at once can fail the run with
# "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905) — a fault
# of the tool, not of allot, that failed CI once.
set +e
"$VENV/bin/schemathesis" --config-file scripts/schemathesis.toml run \
  "http://127.0.0.1:$PORT/api/v1/openapi.json" -H "Authorization: Bearer $TOKEN" \
  --checks all --max-time "$SECONDS_BUDGET" --workers 1 --seed "$SEED" \
  --report junit --report-dir "$REPORT" 2>&1 | tee "$REPORT/run.txt"
STATUS=${PIPESTATUS[0]}
set -e
if ! kill -0 "$SERVE_PID" 2> /dev/null; then
  echo "the daemon died during the run:" >&2
  tail -20 "$WORK/serve.err" >&2
  exit 1
fi
if grep -qi 'panicked' "$WORK/serve.err"; then
  echo "the daemon panicked during the run:" >&2
  grep -i -A3 panicked "$WORK/serve.err" >&2
  exit 1
fi
exit "$STATUS"
