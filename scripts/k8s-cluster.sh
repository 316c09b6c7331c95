#!/usr/bin/env bash
# A real Kubernetes control plane on loopback for allot's Kubernetes backend tests: kine (etcd
# API over SQLite) + kube-apiserver + kube-controller-manager + kwok + the JobSet controller, and
# kube-scheduler when asked. There are no kubelets: kwok plays them for Nodes annotated
# kwok.x-k8s.io/node=fake (Ready status, leases) and for the pods bound to those nodes (Running,
# then Succeeded for pods of Jobs). The binaries are built from Go modules (scripts/k8s/go.mod
# pins Kubernetes, scripts/k8s/jobset/go.mod JobSet).
#
#   scripts/k8s-cluster.sh build   # build the binaries into the cache (skipped when present)
#   scripts/k8s-cluster.sh up      # build, write certs/tokens/kubeconfigs, start, wait until ready
#   scripts/k8s-cluster.sh check   # smoke test: 2 fake GPU nodes, a bound pod, a Job, a JobSet; cleans up
#   scripts/k8s-cluster.sh down    # stop every daemon it started, by pidfile
#   scripts/k8s-cluster.sh status  # which daemons run, and the API server's readiness
#   scripts/k8s-cluster.sh env     # print the KUBECONFIG export for a shell
#   scripts/k8s-cluster.sh scheduler-start|scheduler-stop   # kube-scheduler alone
#
# State (certs, tokens, kubeconfigs, logs, kine's SQLite database) lives under $ALLOT_K8S_DIR
# (default /tmp/allot-k8s); `up` starts with an empty database. Binaries live outside the
# repository under $ALLOT_K8S_CACHE/bin (default /var/cache/allot-k8s/bin), one folder per
# version, so a second `build` is a no-op. Credentials for tests:
#   $STATE/kubeconfig          admin (group system:masters)
#   $STATE/allot.kubeconfig    user "allot", bound (scripts/k8s/allot-rbac.yaml) to ClusterRole allot
#                              (deploy/kubernetes/clusterrole.yaml, what a deployment gets)
#   $STATE/admin.token, $STATE/allot.token, $STATE/pki/ca.crt, server https://127.0.0.1:$API_PORT
# A fake node: a Node with annotation kwok.x-k8s.io/node=fake and its capacity/allocatable
# (e.g. nvidia.com/gpu: "8") in the created object's status (see `check`). A pod on it runs 2 s
# after it is bound; a pod of a Job then succeeds after 1 s, or after its annotation
# pod-complete.stage.kwok.x-k8s.io/delay (e.g. "30s"); a deleted pod goes 1 s later, or after
# pod-delete.stage.kwok.x-k8s.io/delay. (`kubectl delete --wait` of many pods is slow, ~5 pods/s:
# delete with --wait=false and poll.)
# JobSet (jobset.x-k8s.io/v1alpha2): `up` installs the CRD and runs the controller on the host, its
# admission webhooks (scripts/k8s/jobset/webhooks.yaml) registered by URL,
# https://127.0.0.1:$JOBSET_WEBHOOK_PORT, with a serving cert from the cluster CA in
# $STATE/pki/jobset-webhook; its health probe on 127.0.0.1:$JOBSET_HEALTH_PORT, no metrics. The
# webhooks fail closed: with the controller down, no JobSet, nor pod of one, can be created.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
MODDIR=$REPO/scripts/k8s
# Versions: K8S_VERSION must match the require line in scripts/k8s/go.mod (the staging modules
# there are its v0.x.y). kine and kwok are `go install`ed at these versions.
K8S_VERSION=v1.37.2
KINE_VERSION=v0.17.5
KWOK_VERSION=v0.8.0
# Must match the require line in scripts/k8s/jobset/go.mod.
JOBSET_VERSION=v0.8.0
CACHE=${ALLOT_K8S_CACHE:-/var/cache/allot-k8s}
K8S_BIN=$CACHE/bin/kubernetes-$K8S_VERSION
KINE_BIN=$CACHE/bin/kine-$KINE_VERSION
KWOK_BIN=$CACHE/bin/kwok-$KWOK_VERSION
JOBSET_BIN=$CACHE/bin/jobset-$JOBSET_VERSION
STATE=${ALLOT_K8S_DIR:-/tmp/allot-k8s}
KINE_PORT=${KINE_PORT:-12379}
API_PORT=${API_PORT:-16443}
JOBSET_WEBHOOK_PORT=${JOBSET_WEBHOOK_PORT:-19443}
JOBSET_HEALTH_PORT=${JOBSET_HEALTH_PORT:-18081}
# Set to 1 for `up` to start kube-scheduler too; without it pods are bound by whoever schedules
# (allot) through the binding subresource, or by nodeName.
K8S_WITH_SCHEDULER=${K8S_WITH_SCHEDULER:-0}
# More kube-scheduler flags, e.g. "--kube-api-qps=1000 --kube-api-burst=2000" (its client's
# defaults, 50 and 100, cap it at about 50 bindings a second).
K8S_SCHEDULER_ARGS=${K8S_SCHEDULER_ARGS:-}
# Go build parallelism (go build -p); empty means Go's default (one per CPU).
GO_BUILD_P=${GO_BUILD_P:-}
KUBECTL=$K8S_BIN/kubectl
SERVER=https://127.0.0.1:$API_PORT
K8S_CMDS="kube-apiserver kube-controller-manager kube-scheduler kubectl"
DAEMONS="jobset kwok kube-scheduler kube-controller-manager kube-apiserver kine"

log() { echo "k8s-cluster: $*"; }
die() { echo "k8s-cluster: $*" >&2; exit 1; }
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'; }

need_go() {
  command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
  command -v go >/dev/null || die "Go is not installed (k8s.io/kubernetes $K8S_VERSION needs go >= 1.26)"
  if [ -n "$GO_BUILD_P" ]; then export GOFLAGS="${GOFLAGS:+$GOFLAGS }-p=$GO_BUILD_P"; fi
}

# The Kubernetes commands, from the wrapper module: `go build` of k8s.io/kubernetes/cmd/* inside
# scripts/k8s picks up its replace lines (go install pkg@version would refuse them). The version
# variables are what hack/lib/version.sh sets; without them the binaries say v0.0.0-master.
build_kubernetes() {
  local c missing="" v ld="-s -w" tmp t0
  for c in $K8S_CMDS; do [ -x "$K8S_BIN/$c" ] || missing=yes; done
  [ -z "$missing" ] && return 0
  t0=$(date +%s.%N)
  v=${K8S_VERSION#v}
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=${v%%.*} -X $p.gitMinor=$(echo "$v" | cut -d. -f2)"
    ld="$ld -X $p.gitTreeState=clean -X $p.buildDate=2026-01-01T00:00:00Z"
  done
  [ "$(cd "$MODDIR" && go list -m -f '{{.Version}}' k8s.io/kubernetes)" = "$K8S_VERSION" ] ||
    die "scripts/k8s/go.mod does not require k8s.io/kubernetes $K8S_VERSION"
  tmp=$K8S_BIN.tmp
  mkdir -p "$tmp"
  for c in $K8S_CMDS; do
    [ -x "$tmp/$c" ] && continue
    log "building $c $K8S_VERSION (minutes on a small machine)"
    (cd "$MODDIR" && go build -trimpath -ldflags "$ld" -o "$tmp/$c.part" "k8s.io/kubernetes/cmd/$c")
    mv "$tmp/$c.part" "$tmp/$c"
  done
  rm -rf "$K8S_BIN"; mv "$tmp" "$K8S_BIN"
  log "kubernetes $K8S_VERSION built in $(elapsed "$t0") s"
}

# kine's own build (scripts/build) uses cgo SQLite (mattn/go-sqlite3) with these tags, less
# "nats" (a NATS backend we do not use, and a large build).
build_kine() {
  [ -x "$KINE_BIN/kine" ] && return 0
  local t0; t0=$(date +%s.%N)
  log "building kine $KINE_VERSION"
  mkdir -p "$KINE_BIN"
  GOBIN=$KINE_BIN CGO_ENABLED=1 go install -trimpath \
    -tags sqlite_unlock_notify,sqlite_stat4 \
    -ldflags "-s -w -X github.com/k3s-io/kine/pkg/version.Version=$KINE_VERSION" \
    "github.com/k3s-io/kine@$KINE_VERSION"
  log "kine built in $(elapsed "$t0") s"
}

# The kwok binary has no stages built in (kwokctl embeds them): without a Stage config it changes
# nothing. The stages file is kwok's own default node and pod stages from its module
# (kustomize/stage) with the random delays made exact. kwok's delay is random in [delay, jitter],
# and when jitter <= delay it is the jitter: with the pod stages' default 5 s jitter, a pod
# annotated pod-complete.stage.kwok.x-k8s.io/delay: 60s would finish after 5 s; and pod-delete's
# jitter is the deletionTimestamp, so a deleted running pod vanished after a random 1-30 s. Now
# every pod stage waits 1 s, or the pod's <stage>.stage.kwok.x-k8s.io/delay annotation (a Go
# duration, or an RFC 3339 time), or a random time up to .../jitter-delay when that is set too.
# Stages: pod-create, pod-init-container-running, pod-init-container-completed, pod-ready,
# pod-complete (pods of Jobs only), pod-delete. Bump KWOK_STAGES_REV when these edits change.
KWOK_STAGES_REV=2
KWOK_STAGES=$KWOK_BIN/stages-r$KWOK_STAGES_REV.yaml
build_kwok() {
  [ -x "$KWOK_BIN/kwok" ] && [ -s "$KWOK_STAGES" ] && return 0
  local t0 dir f; t0=$(date +%s.%N)
  mkdir -p "$KWOK_BIN"
  if [ ! -x "$KWOK_BIN/kwok" ]; then
    log "building kwok $KWOK_VERSION"
    GOBIN=$KWOK_BIN go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  fi
  dir=$(cd /tmp && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [ -d "$dir/kustomize/stage" ] || die "kwok sources not found in the module cache ($dir)"
  {
    echo "# Generated by scripts/k8s-cluster.sh from sigs.k8s.io/kwok@$KWOK_VERSION kustomize/stage;"
    echo "# the pod stages' random delays made exact (see build_kwok there)."
    for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
      pod/general/pod-create.yaml pod/general/pod-init-container-running.yaml \
      pod/general/pod-init-container-completed.yaml pod/general/pod-ready.yaml \
      pod/general/pod-complete.yaml pod/general/pod-delete.yaml; do
      echo "---"
      case $f in
        pod/*) sed -e '/^    jitterDurationMilliseconds:/d' \
          -e "s|expressionFrom: '.metadata.deletionTimestamp'|expressionFrom: '.metadata.annotations[\"pod-delete.stage.kwok.x-k8s.io/jitter-delay\"]'|" \
          "$dir/kustomize/stage/$f" ;;
        *) cat "$dir/kustomize/stage/$f" ;;
      esac
    done
  } > "$KWOK_STAGES.part"
  # Only the node heartbeat's jitter is left, and no delay from the deletionTimestamp.
  if [ "$(grep -c 'jitterDurationMilliseconds:' "$KWOK_STAGES.part")" != 1 ] ||
    grep -q "expressionFrom: '.metadata.deletionTimestamp'" "$KWOK_STAGES.part"; then
    die "kwok $KWOK_VERSION's stages are not as expected; review build_kwok"
  fi
  mv "$KWOK_STAGES.part" "$KWOK_STAGES"
  log "kwok $KWOK_VERSION and its stages ready in $(elapsed "$t0") s"
}

# The JobSet controller, from the wrapper module scripts/k8s/jobset (go install of the module
# fails: see there), and its CRD, copied from the same module version so that the two match.
JOBSET_CRD=$JOBSET_BIN/jobset.x-k8s.io_jobsets.yaml
build_jobset() {
  [ -x "$JOBSET_BIN/jobset" ] && [ -s "$JOBSET_CRD" ] && return 0
  local t0 dir; t0=$(date +%s.%N)
  [ "$(cd "$MODDIR/jobset" && go list -m -f '{{.Version}}' sigs.k8s.io/jobset)" = "$JOBSET_VERSION" ] ||
    die "scripts/k8s/jobset/go.mod does not require sigs.k8s.io/jobset $JOBSET_VERSION"
  mkdir -p "$JOBSET_BIN"
  if [ ! -x "$JOBSET_BIN/jobset" ]; then
    log "building jobset $JOBSET_VERSION"
    (cd "$MODDIR/jobset" && go build -trimpath \
      -ldflags "-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion=$JOBSET_VERSION" \
      -o "$JOBSET_BIN/jobset.part" sigs.k8s.io/jobset)
    mv "$JOBSET_BIN/jobset.part" "$JOBSET_BIN/jobset"
  fi
  dir=$(cd "$MODDIR/jobset" && go mod download sigs.k8s.io/jobset && go list -m -f '{{.Dir}}' sigs.k8s.io/jobset)
  cp "$dir/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml" "$JOBSET_CRD.part"
  mv "$JOBSET_CRD.part" "$JOBSET_CRD"
  log "jobset $JOBSET_VERSION and its CRD ready in $(elapsed "$t0") s"
}

build_all() {
  need_go
  mkdir -p "$CACHE/bin" 2>/dev/null || die "cannot create $CACHE/bin; set ALLOT_K8S_CACHE to a writable folder"
  build_kine
  build_kwok
  build_jobset
  build_kubernetes
}

build() {
  build_all
  local f
  for f in "$KINE_BIN"/* "$KWOK_BIN"/* "$JOBSET_BIN"/* "$K8S_BIN"/*; do
    printf '%6s  %s\n' "$(du -h "$f" | cut -f1)" "$f"
  done
}

stop_pidfile() {
  local f=$1 p
  [ -s "$f" ] || return 0
  p=$(cat "$f")
  if kill "$p" 2>/dev/null; then
    for _ in $(seq 1 60); do kill -0 "$p" 2>/dev/null || break; sleep 0.25; done
    if kill -0 "$p" 2>/dev/null; then kill -9 "$p" 2>/dev/null || true; fi
  fi
  rm -f "$f"
}

running() { [ -s "$STATE/run/$1.pid" ] && kill -0 "$(cat "$STATE/run/$1.pid")" 2>/dev/null; }

# Start a daemon in the background with its log and pidfile under $STATE.
spawn() {
  local name=$1; shift
  nohup "$@" > "$STATE/log/$name.log" 2>&1 < /dev/null &
  echo $! > "$STATE/run/$name.pid"
}

down() {
  for d in $DAEMONS; do stop_pidfile "$STATE/run/$d.pid"; done
  log "stopped (state kept in $STATE)"
}

kubeconfig() { # file user token
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: allot
  cluster:
    server: $SERVER
    certificate-authority: $STATE/pki/ca.crt
users:
- name: $2
  user:
    token: $3
contexts:
- name: allot
  context: {cluster: allot, user: $2, namespace: default}
current-context: allot
EOF
  chmod 0600 "$1"
}

# A CA, the API server's serving cert (127.0.0.1, and the in-cluster names), the service-account
# signing key, and one bearer token per client. Regenerated on every `up`: the database starts
# empty too, so nothing signed with old keys survives.
write_credentials() {
  local pki=$STATE/pki
  rm -rf "$pki"; install -d -m 0700 "$pki"
  (
    cd "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
      -subj /CN=allot-k8s-ca -addext basicConstraints=critical,CA:TRUE \
      -addext keyUsage=critical,keyCertSign,cRLSign,digitalSignature 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr \
      -subj /CN=kube-apiserver 2>/dev/null
    printf '%s\n' 'basicConstraints=CA:FALSE' 'keyUsage=critical,digitalSignature,keyEncipherment' \
      'extendedKeyUsage=serverAuth' \
      'subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local' \
      > apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile apiserver.ext -out apiserver.crt 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    # The JobSet webhooks' serving cert: the API server calls them at 127.0.0.1 and trusts the
    # caBundle of their configurations, this CA. The controller reads tls.crt/tls.key from here.
    install -d -m 0700 jobset-webhook
    openssl req -newkey rsa:2048 -nodes -keyout jobset-webhook/tls.key -out jobset-webhook.csr \
      -subj /CN=jobset-webhook 2>/dev/null
    printf '%s\n' 'basicConstraints=CA:FALSE' 'keyUsage=critical,digitalSignature,keyEncipherment' \
      'extendedKeyUsage=serverAuth' 'subjectAltName=IP:127.0.0.1,DNS:localhost' > jobset-webhook.ext
    openssl x509 -req -in jobset-webhook.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile jobset-webhook.ext -out jobset-webhook/tls.crt 2>/dev/null
  )
  # token,user,uid,"group1,group2". The control-plane clients are system:masters: a test cluster,
  # and it spares the per-controller service-account credentials.
  local admin allot kcm sched kwok jobset
  admin=$(openssl rand -hex 24); allot=$(openssl rand -hex 24); kcm=$(openssl rand -hex 24)
  sched=$(openssl rand -hex 24); kwok=$(openssl rand -hex 24); jobset=$(openssl rand -hex 24)
  install -m 0600 /dev/null "$pki/tokens.csv"
  cat > "$pki/tokens.csv" <<EOF
$admin,admin,uid-admin,"system:masters"
$allot,allot,uid-allot,"allot"
$kcm,system:kube-controller-manager,uid-kcm,"system:masters"
$sched,system:kube-scheduler,uid-scheduler,
$kwok,kwok,uid-kwok,"system:masters"
$jobset,jobset-controller,uid-jobset,"system:masters"
EOF
  install -m 0600 /dev/null "$STATE/admin.token"; echo "$admin" > "$STATE/admin.token"
  install -m 0600 /dev/null "$STATE/allot.token"; echo "$allot" > "$STATE/allot.token"
  kubeconfig "$STATE/kubeconfig" admin "$admin"
  kubeconfig "$STATE/allot.kubeconfig" allot "$allot"
  kubeconfig "$pki/kcm.kubeconfig" system:kube-controller-manager "$kcm"
  kubeconfig "$pki/scheduler.kubeconfig" system:kube-scheduler "$sched"
  kubeconfig "$pki/kwok.kubeconfig" kwok "$kwok"
  kubeconfig "$pki/jobset.kubeconfig" jobset-controller "$jobset"
}

wait_tcp() { # port seconds
  for _ in $(seq 1 $(($2 * 4))); do (: < "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.25; done
  return 1
}

api_ready() {
  curl -fsS --max-time 2 --cacert "$STATE/pki/ca.crt" -H "Authorization: Bearer $(cat "$STATE/admin.token")" \
    "$SERVER/readyz" >/dev/null 2>&1
}

start_scheduler() {
  running kube-scheduler && return 0
  # --secure-port=0: no healthz/metrics listener (nothing reads them; no port to collide).
  spawn kube-scheduler "$K8S_BIN/kube-scheduler" --kubeconfig="$STATE/pki/scheduler.kubeconfig" \
    --leader-elect=false --secure-port=0 --v=1 ${K8S_SCHEDULER_ARGS:-}
  sleep 1
  running kube-scheduler || die "kube-scheduler exited; see $STATE/log/kube-scheduler.log"
  log "kube-scheduler started"
}

jobset_ready() { curl -fsS --max-time 2 "http://127.0.0.1:$JOBSET_HEALTH_PORT/readyz" >/dev/null 2>&1; }

# Whether the API server's discovery (the aggregated one, which clients read) lists JobSets.
# (Not curl | grep -q: grep's early exit fails curl, and with it the pipeline, under pipefail.)
jobset_discovered() {
  local d
  d=$(curl -fsS --max-time 2 --cacert "$STATE/pki/ca.crt" -H "Authorization: Bearer $(cat "$STATE/admin.token")" \
    -H 'Accept: application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList' "$SERVER/apis" 2>/dev/null) ||
    return 1
  grep -Eq '"name": ?"jobset.x-k8s.io"' <<< "$d"
}

start_jobset() {
  # Certs from $STATE/pki (no cert rotation: that would want a Service and a Secret); every
  # listener on loopback; metrics off ("0"); one controller, so no leader election.
  cat > "$STATE/jobset-config.yaml" <<EOF
apiVersion: config.jobset.x-k8s.io/v1alpha1
kind: Configuration
internalCertManagement: {enable: false}
webhook: {host: 127.0.0.1, port: $JOBSET_WEBHOOK_PORT, certDir: $STATE/pki/jobset-webhook}
metrics: {bindAddress: "0"}
health: {healthProbeBindAddress: "127.0.0.1:$JOBSET_HEALTH_PORT"}
leaderElection: {leaderElect: false}
EOF
  spawn jobset "$JOBSET_BIN/jobset" --config="$STATE/jobset-config.yaml" \
    --kubeconfig="$STATE/pki/jobset.kubeconfig" \
    --zap-devel=false --zap-encoder=console --zap-time-encoding=iso8601 --zap-stacktrace-level=panic
}

# A JobSet created with a server-side dry run: prints what the mutating webhook defaulted
# (successPolicy.operator "All"), or nothing while the webhooks are not called.
jobset_dry_run() {
  "$KUBECTL" --kubeconfig="$STATE/kubeconfig" create --dry-run=server \
    -o jsonpath='{.spec.successPolicy.operator}' -f - 2>/dev/null <<EOF
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: webhook-probe, namespace: default}
spec:
  replicatedJobs:
  - name: w
    template:
      spec:
        template:
          spec:
            containers: [{name: main, image: busybox}]
EOF
}

# The webhooks are registered only once the controller serves them: they fail closed, so JobSets
# (and their pods) created before would be refused. A dry run then shows they are called.
jobset_webhooks() {
  local ca op=""
  for _ in $(seq 1 240); do
    jobset_ready && break
    running jobset || die "the JobSet controller exited; see $STATE/log/jobset.log"
    sleep 0.25
  done
  jobset_ready || die "the JobSet controller not ready after 60 s; see $STATE/log/jobset.log"
  ca=$(base64 -w0 < "$STATE/pki/ca.crt")
  sed -e "s|@URL@|https://127.0.0.1:$JOBSET_WEBHOOK_PORT|" -e "s|@CA_BUNDLE@|$ca|" \
    "$MODDIR/jobset/webhooks.yaml" | "$KUBECTL" --kubeconfig="$STATE/kubeconfig" apply -f - >/dev/null
  for _ in $(seq 1 40); do
    op=$(jobset_dry_run || true)
    [ "$op" = All ] && break
    sleep 0.25
  done
  [ "$op" = All ] || die "the JobSet webhooks do not answer; see $STATE/log/jobset.log and kube-apiserver.log"
}

up() {
  local t0 tb warm; t0=$(date +%s.%N)
  build_all
  tb=$(date +%s.%N)
  command -v openssl >/dev/null || die "openssl is needed for the certificates"
  install -d -m 0755 "$STATE" "$STATE/run" "$STATE/log"
  if running kube-apiserver || running kine; then die "already running (run '$0 down' first)"; fi
  down >/dev/null
  # Another cluster on these ports would answer our readiness checks.
  local port
  for port in "$KINE_PORT" "$API_PORT" "$JOBSET_WEBHOOK_PORT" "$JOBSET_HEALTH_PORT"; do
    if (: < "/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      die "127.0.0.1:$port is in use (set KINE_PORT / API_PORT / JOBSET_WEBHOOK_PORT / JOBSET_HEALTH_PORT)"
    fi
  done
  write_credentials
  rm -rf "$STATE/kine"; install -d -m 0700 "$STATE/kine"
  # kine from its state dir with no --endpoint: its default SQLite DSN (./db/state.db, WAL, busy
  # timeout) tuned for this use. --metrics-bind-address 0: no :8080 listener on all interfaces.
  (cd "$STATE/kine" && spawn kine "$KINE_BIN/kine" --listen-address="127.0.0.1:$KINE_PORT" \
    --metrics-bind-address=0)
  wait_tcp "$KINE_PORT" 30 || die "kine did not listen on $KINE_PORT; see $STATE/log/kine.log"
  local pki=$STATE/pki
  # --endpoint-reconciler-type=none: the "kubernetes" Service's endpoint would be 127.0.0.1,
  # which Endpoints validation rejects (loopback), so the reconciler would only log errors.
  spawn kube-apiserver "$K8S_BIN/kube-apiserver" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
    --etcd-servers="http://127.0.0.1:$KINE_PORT" \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" --token-auth-file="$pki/tokens.csv" \
    --authorization-mode=Node,RBAC \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --service-cluster-ip-range=10.96.0.0/16 --endpoint-reconciler-type=none \
    --allow-privileged=true --profiling=false --v=1
  for _ in $(seq 1 240); do
    api_ready && break
    running kube-apiserver || die "kube-apiserver exited; see $STATE/log/kube-apiserver.log"
    sleep 0.25
  done
  api_ready || die "kube-apiserver not ready after 60 s; see $STATE/log/kube-apiserver.log"
  log "kube-apiserver ready after $(elapsed "$tb") s"
  "$KUBECTL" --kubeconfig="$STATE/kubeconfig" apply -f "$REPO/deploy/kubernetes/clusterrole.yaml" \
    -f "$MODDIR/allot-rbac.yaml" >/dev/null
  # Server-side: a client-side apply would copy the ~750 KB CRD into an annotation, which is
  # limited to 256 KB.
  "$KUBECTL" --kubeconfig="$STATE/kubeconfig" apply --server-side -f "$JOBSET_CRD" >/dev/null
  # The controller manager's garbage collector (and quota) read discovery when they start, and
  # again only every 30 s: started before JobSets are served, a deleted JobSet's Jobs and pods
  # would wait up to 30 s for it.
  for _ in $(seq 1 120); do jobset_discovered && break; sleep 0.25; done
  jobset_discovered || die "the JobSet CRD is not served after 30 s; see $STATE/log/kube-apiserver.log"
  # The API server builds a CRD's write path on its first write, ~2 s for JobSet's big schema: a
  # dry run now overlaps that with the controllers' start instead of the first test's JobSet.
  jobset_dry_run >/dev/null & warm=$!
  # Without cloud or kubelets: no node CIDRs, and the legacy token controller signs with sa.key.
  spawn kube-controller-manager "$K8S_BIN/kube-controller-manager" \
    --kubeconfig="$pki/kcm.kubeconfig" --leader-elect=false --secure-port=0 \
    --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
    --allocate-node-cidrs=false --v=1
  # kwok manages only the nodes annotated kwok.x-k8s.io/node=fake (and their pods), and no
  # kubelet server (no --server-address / --node-port).
  # scripts/k8s/program-stages.yaml: the "programs" of allot's own pods (see there).
  spawn kwok "$KWOK_BIN/kwok" -c "$KWOK_STAGES" -c "$MODDIR/program-stages.yaml" \
    --kubeconfig="$pki/kwok.kubeconfig" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-lease-duration-seconds=40
  [ "$K8S_WITH_SCHEDULER" = 1 ] && start_scheduler
  start_jobset
  # Pods need the namespace's "default" ServiceAccount (admission), which the controller
  # manager creates: once it exists, the controller manager works.
  for _ in $(seq 1 240); do
    "$KUBECTL" --kubeconfig="$STATE/kubeconfig" get serviceaccount default >/dev/null 2>&1 && break
    running kube-controller-manager || die "kube-controller-manager exited; see $STATE/log/kube-controller-manager.log"
    sleep 0.25
  done
  "$KUBECTL" --kubeconfig="$STATE/kubeconfig" get serviceaccount default >/dev/null ||
    die "no default ServiceAccount after 60 s; see $STATE/log/kube-controller-manager.log"
  running kwok || die "kwok exited; see $STATE/log/kwok.log"
  wait "$warm" || true
  jobset_webhooks
  log "up in $(elapsed "$t0") s (control plane $(elapsed "$tb") s); export KUBECONFIG=$STATE/kubeconfig"
}

status() {
  local d rc=0
  for d in $DAEMONS; do
    if running "$d"; then echo "$d: running (pid $(cat "$STATE/run/$d.pid"))"; else echo "$d: stopped"; fi
  done
  if [ -s "$STATE/admin.token" ] && api_ready; then echo "kube-apiserver: ready at $SERVER"; else echo "kube-apiserver: not ready"; rc=1; fi
  return $rc
}

# Bind a pod as allot would, with allot's token, through the binding subresource.
bind_pod() { # pod node
  curl -fsS --cacert "$STATE/pki/ca.crt" -H "Authorization: Bearer $(cat "$STATE/allot.token")" \
    -H 'Content-Type: application/json' -X POST "$SERVER/api/v1/namespaces/default/pods/$1/binding" \
    -d "{\"apiVersion\":\"v1\",\"kind\":\"Binding\",\"metadata\":{\"name\":\"$1\"},\"target\":{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"name\":\"$2\"}}" >/dev/null
}

# The smoke test. Nodes named smoke-gpu-N, pod smoke-bound, Job smoke-job, JobSet smoke-jobset;
# all deleted at the end.
check() {
  local k=("$KUBECTL" --kubeconfig="$STATE/kubeconfig") t0 n pod
  t0=$(date +%s.%N)
  api_ready || die "the cluster is not up"
  for n in 0 1; do
    # Status in the manifest: the API server keeps a new Node's status, and kwok's node-initialize
    # stage keeps its capacity/allocatable.
    "${k[@]}" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: smoke-gpu-$n
  annotations: {kwok.x-k8s.io/node: fake}
  labels: {type: kwok, kubernetes.io/hostname: smoke-gpu-$n, nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}
status:
  capacity: {cpu: "64", memory: 512Gi, pods: "110", nvidia.com/gpu: "8"}
  allocatable: {cpu: "64", memory: 512Gi, pods: "110", nvidia.com/gpu: "8"}
EOF
  done
  "${k[@]}" wait --for=condition=Ready node/smoke-gpu-0 node/smoke-gpu-1 --timeout=60s >/dev/null
  log "check: 2 nodes Ready after $(elapsed "$t0") s: $("${k[@]}" get node smoke-gpu-0 -o jsonpath='{.status.allocatable.nvidia\.com/gpu}') GPUs each"
  # A pod bound by nodeName, as allot would after choosing the node.
  "${k[@]}" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: smoke-bound}
spec:
  nodeName: smoke-gpu-0
  containers:
  - name: main
    image: busybox
    resources: {limits: {nvidia.com/gpu: "2"}}
EOF
  "${k[@]}" wait --for=jsonpath='{.status.phase}'=Running pod/smoke-bound --timeout=60s >/dev/null
  log "check: pod smoke-bound Running after $(elapsed "$t0") s"
  # A Job whose pod kwok completes 3 s after it runs (the per-pod delay annotation).
  "${k[@]}" apply -f - >/dev/null <<EOF
apiVersion: batch/v1
kind: Job
metadata: {name: smoke-job}
spec:
  backoffLimit: 0
  template:
    metadata:
      annotations: {pod-complete.stage.kwok.x-k8s.io/delay: 3s}
    spec:
      restartPolicy: Never
      containers:
      - name: main
        image: busybox
        resources: {limits: {nvidia.com/gpu: "8"}}
EOF
  for _ in $(seq 1 120); do
    pod=$("${k[@]}" get pods -l job-name=smoke-job -o jsonpath='{.items[0].metadata.name}' 2>/dev/null || true)
    [ -n "$pod" ] && break; sleep 0.25
  done
  [ -n "$pod" ] || die "check: the Job made no pod (kube-controller-manager?)"
  if ! running kube-scheduler; then
    bind_pod "$pod" smoke-gpu-1
    log "check: bound $pod to smoke-gpu-1 with the allot token"
  fi
  "${k[@]}" wait --for=condition=Complete job/smoke-job --timeout=90s >/dev/null
  log "check: job smoke-job Complete after $(elapsed "$t0") s (pod on $("${k[@]}" get pod "$pod" -o jsonpath='{.spec.nodeName}'))"
  "${k[@]}" delete job smoke-job --cascade=foreground --wait=true --timeout=60s >/dev/null
  "${k[@]}" delete pod smoke-bound --wait=true --timeout=60s >/dev/null
  check_jobset
  "${k[@]}" delete node smoke-gpu-0 smoke-gpu-1 --wait=true --timeout=60s >/dev/null
  log "check: passed in $(elapsed "$t0") s"
}

# A JobSet as allot gets them: created suspended, for allot's scheduler, then resumed, its pods
# bound by us (no scheduler binds pods of schedulerName allot), completed by kwok.
check_jobset() {
  local k=("$KUBECTL" --kubeconfig="$STATE/kubeconfig") t0 t1 sel=jobset.sigs.k8s.io/jobset-name=smoke-jobset
  local jobs pods pod n
  t0=$(date +%s.%N); t1=$t0
  "${k[@]}" apply -f - >/dev/null <<EOF
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: smoke-jobset, namespace: default}
spec:
  suspend: true
  replicatedJobs:
  - name: workers
    replicas: 2
    template:
      spec:
        # JobSet makes its Jobs Indexed, which wants completions whenever parallelism is set.
        parallelism: 1
        completions: 1
        template:
          metadata:
            annotations: {pod-complete.stage.kwok.x-k8s.io/delay: 3s}
          spec:
            schedulerName: allot
            restartPolicy: Never
            containers:
            - name: main
              image: busybox
              resources: {limits: {nvidia.com/gpu: "8"}}
EOF
  for _ in $(seq 1 120); do
    jobs=$("${k[@]}" get jobs -l "$sel" -o jsonpath='{range .items[*]}{.metadata.name}={.spec.suspend} {end}')
    [ "$(echo "$jobs" | wc -w)" = 2 ] && break; sleep 0.25
  done
  [ "$(echo "$jobs" | wc -w)" = 2 ] || die "check: JobSet smoke-jobset made no 2 Jobs ($jobs); see $STATE/log/jobset.log"
  case $jobs in *=false*) die "check: JobSet smoke-jobset is suspended but its Jobs are not: $jobs" ;; esac
  log "check: suspended JobSet smoke-jobset made 2 suspended Jobs in $(elapsed "$t1") s: $(echo $jobs)"
  # The job controller makes the pods of a Job that is not suspended at once: 1 s is plenty.
  sleep 1
  pods=$("${k[@]}" get pods -l "$sel" -o name)
  [ -z "$pods" ] || die "check: suspended JobSet smoke-jobset has pods: $pods"
  t1=$(date +%s.%N)
  "${k[@]}" patch jobset smoke-jobset --type=merge -p '{"spec":{"suspend":false}}' >/dev/null
  for _ in $(seq 1 120); do
    pods=$("${k[@]}" get pods -l "$sel" -o jsonpath='{range .items[*]}{.metadata.name} {end}')
    [ "$(echo "$pods" | wc -w)" = 2 ] && break; sleep 0.25
  done
  [ "$(echo "$pods" | wc -w)" = 2 ] || die "check: resumed JobSet smoke-jobset has no 2 pods ($pods)"
  log "check: resumed; its 2 pods made in $(elapsed "$t1") s"
  t1=$(date +%s.%N); n=0
  for pod in $pods; do bind_pod "$pod" "smoke-gpu-$n"; n=$((n + 1)); done
  "${k[@]}" wait --for=condition=Completed=True jobset/smoke-jobset --timeout=90s >/dev/null
  log "check: pods bound to smoke-gpu-0/1; JobSet Completed after $(elapsed "$t1") s"
  t1=$(date +%s.%N)
  "${k[@]}" delete jobset smoke-jobset --cascade=foreground --wait=true --timeout=60s >/dev/null
  log "check: JobSet deleted in $(elapsed "$t1") s (JobSet steps $(elapsed "$t0") s)"
}

case "${1:-}" in
  build) build ;;
  up) up ;;
  down) down ;;
  status) status ;;
  check) check ;;
  env) echo "export KUBECONFIG=$STATE/kubeconfig PATH=$K8S_BIN:\$PATH" ;;
  scheduler-start) install -d "$STATE/run" "$STATE/log"; start_scheduler ;;
  scheduler-stop) stop_pidfile "$STATE/run/kube-scheduler.pid"; log "kube-scheduler stopped" ;;
  *) echo "usage: $0 build|up|check|down|status|env|scheduler-start|scheduler-stop  (state in \$ALLOT_K8S_DIR, default /tmp/allot-k8s; binaries in \$ALLOT_K8S_CACHE/bin, default /var/cache/allot-k8s/bin)" >&2; exit 2 ;;
esac
