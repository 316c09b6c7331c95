#!/usr/bin/env bash
# The dashboard in a real browser: headless Chromium driven over WebDriver (chromedriver,
# spoken to with curl) logs in through the login form, opens every page, and checks that the
# workloads submitted through the API, their reasons and the chart SVGs are there; it waits for
# an htmx poll to bring in a workload submitted after the page loaded, and for an idle rule's
# warning; it reads an estimated start on the queue and the fair-share standing on the projects
# page, and clicks a workload's cancel and suspend buttons and sees its state change.
# Screenshots go to target/ci-output/dashboard/.
#
# WebDriver rather than `chromium --dump-dom`: the login form is typed into and submitted by the
# browser, which must keep the HttpOnly cookie itself, and the live DOM can be read after htmx
# has polled — neither can be seen in one `--dump-dom` of a page.
#
# Usage: scripts/dashboard-check.sh PATH/TO/allot   (a debug or release build)
# Installs Debian's chromium, chromium-driver and jq with apt when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:?usage: scripts/dashboard-check.sh PATH/TO/allot}
[ -x "$BIN" ] || { echo "$BIN is not an executable: build it first (cargo build -p allot)" >&2; exit 1; }
PORT=${ALLOT_DASHBOARD_PORT:-7382}
DRIVER_PORT=${ALLOT_CHROMEDRIVER_PORT:-9515}
URL=http://127.0.0.1:$PORT
WD=http://127.0.0.1:$DRIVER_PORT
OUT=target/ci-output/dashboard
mkdir -p $OUT

NEED=""
command -v chromium > /dev/null || NEED="$NEED chromium"
command -v chromedriver > /dev/null || NEED="$NEED chromium-driver"
command -v jq > /dev/null || NEED="$NEED jq"
command -v curl > /dev/null || NEED="$NEED curl"
if [ -n "$NEED" ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $NEED
fi

WORK=$(mktemp -d)
SERVE_PID=""
DRIVER_PID=""
SESSION=""
cleanup() {
  # The session first (chromedriver then ends its chromium), then the processes we started.
  [ -n "$SESSION" ] && curl -s -X DELETE $WD/session/$SESSION > /dev/null 2>&1 || true
  [ -n "$DRIVER_PID" ] && kill $DRIVER_PID 2> /dev/null || true
  [ -n "$SERVE_PID" ] && kill $SERVE_PID 2> /dev/null || true
  [ -n "$DRIVER_PID" ] && wait $DRIVER_PID 2> /dev/null || true
  [ -n "$SERVE_PID" ] && wait $SERVE_PID 2> /dev/null || true
  rm -rf $WORK
}
trap cleanup EXIT

fail() {
  echo "dashboard-check: FAIL: $*" >&2
  [ -f $WORK/page.html ] && cp $WORK/page.html $OUT/failed-page.html
  [ -f $WORK/serve.err ] && tail -20 $WORK/serve.err >&2
  exit 1
}

# --- the daemon -------------------------------------------------------------------------------
$BIN serve --single-user --data-dir $WORK/data --listen 127.0.0.1:$PORT --inventory examples/cluster.yaml \
  --policy examples/policy.yaml > $WORK/serve.out 2> $WORK/serve.err &
SERVE_PID=$!
for _ in $(seq 100); do grep -q '^allot_' $WORK/serve.out 2> /dev/null && break; sleep 0.1; done
TOKEN=$(grep '^allot_' $WORK/serve.out) || fail "no admin token printed"
grep -q "dashboard $URL/" $WORK/serve.err || fail "the start-up message does not name the dashboard"

submit() { # project gpus kind [name]
  curl -sf -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
    -d "{\"project\": \"$1\", \"gpus\": $2, \"kind\": \"$3\", \"name\": \"$4\", \"command\": [\"sleep\", \"600\"]}" \
    $URL/api/v1/workloads | jq -r .id
}
submit_json() { # request body
  curl -sf -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' -d "$1" \
    $URL/api/v1/workloads | jq -r .id
}
state_of() { curl -sf -H "Authorization: Bearer $TOKEN" $URL/api/v1/workloads/$1 | jq -r .state; }
NOTEBOOK=$(submit research 1 notebook idle-notebook)   # research-notebooks rule: warned after 1 min
# research's 4 V100s: one run with a max runtime holds them all, the next waits for its end.
ETA_FIRST=$(submit_json '{"project": "research", "gpus": 4, "gpu_models": ["V100M32"], "max_runtime_s": 3600,
  "kind": "batch", "name": "eta-first", "command": ["sleep", "600"]}')
ETA_NEXT=$(submit_json '{"project": "research", "gpus": 4, "gpu_models": ["V100M32"],
  "kind": "batch", "name": "eta-next", "command": ["sleep", "600"]}')
RUNNING=$(submit vision 2 training vision-train)
HUGE=$(submit vision 64 training vision-huge)          # more than vision may ever hold
QUEUED=$(submit nlp 8 batch nlp-batch)
sleep 1
curl -sf -H "Authorization: Bearer $TOKEN" "$URL/api/v1/workloads?state=pending" > $WORK/pending.json
HUGE_CODE=$(jq -r ".workloads[] | select(.id == $HUGE) | .reason_code" $WORK/pending.json)
[ -n "$HUGE_CODE" ] && [ "$HUGE_CODE" != null ] || fail "workload $HUGE has no reason code: $(cat $WORK/pending.json)"

# --- the browser ------------------------------------------------------------------------------
chromedriver --port=$DRIVER_PORT > $WORK/driver.log 2>&1 &
DRIVER_PID=$!
for _ in $(seq 100); do curl -sf $WD/status > /dev/null 2>&1 && break; sleep 0.1; done
CAPS='{"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
  "binary": "/usr/bin/chromium",
  "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-dev-shm-usage", "--window-size=1366,900"]}}}}'
SESSION=$(curl -sf -d "$CAPS" $WD/session | jq -r .value.sessionId) || fail "no WebDriver session"
[ -n "$SESSION" ] && [ "$SESSION" != null ] || fail "no WebDriver session: $(cat $WORK/driver.log)"
S=$WD/session/$SESSION

wd() { # method path [json]
  if [ -n "${3:-}" ]; then curl -sf -X "$1" -H 'Content-Type: application/json' -d "$3" "$S$2"
  else curl -sf -X "$1" "$S$2"; fi
}
open_page() { wd POST /url "{\"url\": \"$URL$1\"}" > /dev/null || fail "cannot open $1"; }
source_now() { wd GET /source | jq -r .value > $WORK/page.html; }
current_url() { wd GET /url | jq -r .value; }
shot() { wd GET /screenshot | jq -r .value | base64 -d > $OUT/$1.png || fail "no screenshot $1"; }
has() { grep -qF -- "$1" $WORK/page.html || fail "${2:-page} lacks: $1"; }
lacks() { ! grep -qF -- "$1" $WORK/page.html || fail "${2:-page} should not show: $1"; }
element() { # css selector (no double quotes) → element id
  wd POST /element "{\"using\": \"css selector\", \"value\": \"$1\"}" | jq -r '.value | to_entries[0].value' \
    || fail "no element $1 on $(current_url)"
}

# Not logged in: the dashboard sends the browser to the login form.
open_page /fleet
[ "$(current_url)" = "$URL/login" ] || fail "an unauthenticated page did not redirect to /login: $(current_url)"
source_now; has 'name="token"' login
shot login
FIELD=$(element '#token')
wd POST /element/$FIELD/value "{\"text\": \"$TOKEN\"}" > /dev/null || fail "cannot type the token"
wd POST /element/$(element 'button[type=submit]')/click '{}' > /dev/null || fail "cannot submit the login form"
sleep 0.5
[ "$(current_url)" = "$URL/fleet" ] || fail "login did not land on /fleet: $(current_url)"
# The cookie is the browser's, HttpOnly: page JavaScript cannot read it.
JS_COOKIE=$(wd POST /execute/sync '{"script": "return document.cookie", "args": []}' | jq -r .value)
[ -z "$JS_COOKIE" ] || fail "the session cookie is readable by scripts: $JS_COOKIE"

source_now
has '<svg' fleet; has 'no telemetry' fleet; has "href=\"/workload/$RUNNING\"" fleet
# Every workload link in the device map is readable on its cell: WCAG contrast >= 4.5.
CONTRAST_JS='function lum(c) { var v = c.match(/[0-9.]+/g).slice(0, 3).map(function (x) {
    x = x / 255; return x <= 0.03928 ? x / 12.92 : Math.pow((x + 0.055) / 1.055, 2.4); });
  return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]; }
var links = document.querySelectorAll("td.cell a"), bad = [];
links.forEach(function (a) {
  var fg = lum(getComputedStyle(a).color), bg = lum(getComputedStyle(a.closest("td")).backgroundColor);
  var ratio = (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
  if (ratio < 4.5) bad.push(a.textContent + " " + ratio.toFixed(2)); });
return links.length + " links; low contrast: " + (bad.join(", ") || "none");'
CONTRAST=$(wd POST /execute/sync "$(jq -n --arg s "$CONTRAST_JS" '{script: $s, args: []}')" | jq -r .value)
case "$CONTRAST" in
  "0 links"*) fail "the device map has no workload links: $CONTRAST" ;;
  *"low contrast: none") ;;
  *) fail "device-map links hard to read on their cells: $CONTRAST" ;;
esac
shot fleet

open_page /queue; source_now
has "vision-huge" queue; has "$HUGE_CODE" queue; has "nlp-batch" queue
lacks "vision-train" queue
shot queue
open_page "/queue?project=nlp"; source_now
has "nlp-batch" "queue?project=nlp"; lacks "vision-huge" "queue?project=nlp"

open_page /workload/$HUGE; source_now
has "vision-huge" workload; has "$HUGE_CODE" workload; has "/api/v1/workloads/$HUGE/why" workload
has "submitted" workload
shot workload

open_page /projects; source_now
has '<svg' projects; has 'project:vision' projects; has 'lost to pre-emption' projects
# Fair-share standing (derived every 5 s: the htmx poll brings it in) and the ledger per period.
# research (no cohort) wants 4 more V100s than its guarantee: it cannot borrow, it waits.
WAITS='<td>waits for its own quota (no cohort to borrow from)</td>'
for _ in $(seq 30); do source_now; grep -qF "rank in the next cycle" $WORK/page.html && grep -qF "$WAITS" $WORK/page.html && break; sleep 0.5; done
has 'Fair-share standing' projects; has 'rank in the next cycle' projects; has "$WAITS" projects
has '<td class="num">– (no cohort)</td>' "projects (research's borrow limit)"
has 'Ledger per period' projects; has "$(date -u +%F)" "projects (today's period)"
shot projects

# An estimated start: eta-next waits for eta-first's max runtime.
[ "$(state_of $ETA_FIRST)" = running ] || fail "eta-first ($ETA_FIRST) is not running: $(state_of $ETA_FIRST)"
open_page "/queue?project=research"
for _ in $(seq 30); do source_now; grep -qF "eta-first reaches its max runtime" $WORK/page.html && break; sleep 0.5; done
has "≈ in" "queue (estimated start)"; has "(after #$ETA_FIRST eta-first reaches its max runtime)" "queue (estimated start)"
shot queue-eta

open_page /policy; source_now
has 'research-notebooks' policy
wd POST /element/$(element '#policy')/value '{"text": "projects:\n  - name: x\n    gpu: 3\n"}' > /dev/null \
  || fail "cannot type a candidate policy"
wd POST /element/$(element 'main form button')/click '{}' > /dev/null || fail "cannot submit the policy form"
sleep 0.5; source_now
has '✗' "policy check"; has 'problem' "policy check"
shot policy

# Live updates: a workload submitted while the queue is open appears without a reload.
open_page /queue
LATE=$(submit translation 64 batch late-arrival)
for _ in $(seq 30); do source_now; grep -qF "late-arrival" $WORK/page.html && break; sleep 0.5; done
has "late-arrival" "queue after an htmx poll"

# Idle: the research notebook sends no heartbeat; its rule warns after one minute.
open_page /idle
for _ in $(seq 90); do source_now; grep -qF "idle-notebook" $WORK/page.html && break; sleep 1; done
has "idle-notebook" idle; has "idle_warning" idle
shot idle

# Actions: click cancel on a pending workload and suspend on a running one; the page they
# return to shows the new state.
click_action() { # workload action expected-state
  open_page /workload/$1; source_now
  has "data-action=\"$2\"" "workload $1 ($2 button)"
  wd POST /element/$(element "button[data-action=$2]")/click '{}' > /dev/null || fail "cannot click $2 on $1"
  for _ in $(seq 40); do
    source_now
    [ "$(current_url)" = "$URL/workload/$1" ] && grep -qF "<span class=\"n\">$3</span>" $WORK/page.html && break
    sleep 0.5; open_page /workload/$1
  done
  has "<span class=\"n\">$3</span>" "workload $1 after $2"
  [ "$(state_of $1)" = "$3" ] || fail "workload $1 is $(state_of $1) after $2, not $3"
}
click_action $QUEUED cancel cancelled
shot cancelled
click_action $RUNNING suspend suspended
shot suspended
# Suspended by its user is not idle: the Idle page does not list it.
open_page /idle; source_now
lacks "vision-train" "idle (after vision-train was suspended by hand)"

echo "dashboard-check: ok — login, 6 pages, readable device-map links, live update, idle warning (not a hand suspension), estimated start, standing, cancel and suspend clicks (workloads $NOTEBOOK $RUNNING $HUGE $QUEUED $LATE $ETA_FIRST $ETA_NEXT); screenshots in $OUT"
