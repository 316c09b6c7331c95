#!/usr/bin/env python3
"""allot against kube-scheduler on one Kubernetes control plane: how fast each binds pods and
how many whole nodes each leaves free.

Both arms run on the same API server and the same kwok nodes (NODES nodes x 8 GPUs, default
1,000), one after the other, each on the same seeded stream of single-GPU pods (10,000 per arm
by default):

  backlog  the scheduler is stopped; 60 % of the cluster's GPUs in pods are created; then the
           scheduler starts and binds them all. Bind rate = pods / (last binding - first).
  churn    with the scheduler running, a seeded 30 % of the GPUs' worth of bound pods are
           deleted, then the rest of the pods (to 10,000) are created as fast as this client
           can; each pod's time from its creation (the create call's answer) to its binding
           (the watch event that shows its node) gives p50/p99.

After each phase: nodes with all 8 GPUs free (whole-node blocks: where an 8-GPU job can
start). kube-scheduler runs with its defaults (it spreads: LeastAllocated scoring), once as it
comes and once with its API client's rate limit raised (its defaults, QPS 50 / burst 100, cap
it at about 50 bindings a second); allot with one project (the namespace) guaranteed every GPU.

Needs the test control plane up without kube-scheduler, on its own state and ports if another
runs (the script starts and stops kube-scheduler and allot itself):

  ALLOT_K8S_DIR=/tmp/allot-k8s-bench KINE_PORT=12391 API_PORT=16451 \
    bash scripts/k8s-cluster.sh up
  ALLOT_K8S_DIR=/tmp/allot-k8s-bench KINE_PORT=12391 API_PORT=16451 \
    python3 scripts/bench-k8s-binding.py --allot target/release/allot
  ALLOT_K8S_DIR=/tmp/allot-k8s-bench ... bash scripts/k8s-cluster.sh down

Only the Python standard library is used; the API is spoken directly (HTTPS, bearer token).
"""

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = "NVIDIA-H100-80GB-HBM3"
NAMESPACE = "bench"
GPUS_PER_NODE = 8


def die(message):
    print(f"bench-k8s-binding: {message}", file=sys.stderr)
    sys.exit(1)


def log(message):
    print(f"bench-k8s-binding: {message}", file=sys.stderr, flush=True)


class Api:
    """The API server over HTTPS with a bearer token; one connection per thread."""

    def __init__(self, state, port):
        self.host = "127.0.0.1"
        self.port = port
        self.context = ssl.create_default_context(cafile=os.path.join(state, "pki", "ca.crt"))
        with open(os.path.join(state, "admin.token")) as f:
            self.token = f.read().strip()
        self.local = threading.local()

    def connection(self):
        if getattr(self.local, "conn", None) is None:
            self.local.conn = http.client.HTTPSConnection(
                self.host, self.port, context=self.context, timeout=120)
        return self.local.conn

    def call(self, method, path, body=None, ok=(200, 201, 202)):
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        for attempt in range(5):
            try:
                conn = self.connection()
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                payload = response.read()
                break
            except (OSError, http.client.HTTPException) as e:
                self.local.conn = None
                if attempt == 4:
                    raise RuntimeError(f"{method} {path}: {e}") from e
                time.sleep(0.2 * (attempt + 1))
        if response.status not in ok:
            raise RuntimeError(f"{method} {path}: {response.status} {payload[:300]!r}")
        return json.loads(payload) if payload else None

    def stream(self, path):
        """A watch: yields each event (a dict) as it arrives."""
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.context,
                                           timeout=3600)
        conn.request("GET", path, headers={"Authorization": f"Bearer {self.token}"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"watch {path}: {response.status} {response.read()[:300]!r}")
        while True:
            line = response.readline()
            if not line:
                return
            yield json.loads(line)


class Watch:
    """Every pod of the namespace: when it was first seen bound, and whether it still exists."""

    def __init__(self, api):
        self.api = api
        self.lock = threading.Lock()
        self.bound_at = {}   # name -> monotonic time its node first showed
        self.node_of = {}    # name -> node, for pods that exist
        self.exists = set()
        self.version = api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?limit=1")[
            "metadata"]["resourceVersion"]
        self.error = None
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while True:
            try:
                path = (f"/api/v1/namespaces/{NAMESPACE}/pods?watch=true"
                        f"&resourceVersion={self.version}&allowWatchBookmarks=true")
                for event in self.api.stream(path):
                    self.take(event)
            except Exception as e:  # a dropped watch: resume from the last version
                self.error = str(e)
                time.sleep(0.2)

    def take(self, event):
        now = time.monotonic()
        pod = event.get("object", {})
        meta = pod.get("metadata", {})
        if "resourceVersion" in meta:
            self.version = meta["resourceVersion"]
        if event.get("type") == "BOOKMARK":
            return
        if event.get("type") == "ERROR":
            raise RuntimeError(f"watch error: {pod}")
        name = meta.get("name")
        node = pod.get("spec", {}).get("nodeName")
        with self.lock:
            if event["type"] == "DELETED":
                self.exists.discard(name)
                self.node_of.pop(name, None)
                return
            self.exists.add(name)
            if node:
                self.node_of[name] = node
                self.bound_at.setdefault(name, now)

    def snapshot(self):
        with self.lock:
            return dict(self.bound_at), dict(self.node_of), set(self.exists)


def node_manifest(i):
    name = f"bench-gpu-{i:04d}"
    resources = {"cpu": "128", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": str(GPUS_PER_NODE)}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "labels": {"type": "kwok", "kubernetes.io/hostname": name,
                                "nvidia.com/gpu.product": MODEL}},
        "status": {"capacity": resources, "allocatable": resources},
    }


def pod_manifest(name, scheduler):
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench": "binding", "allot.dev/user": "bench"}},
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "busybox",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }


def parallel(threads, items, function):
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(function, items))


def wait_until(what, predicate, timeout, every=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    log(f"timed out after {timeout} s waiting for {what}")
    return False


def ensure_nodes(api, count, threads):
    have = {n["metadata"]["name"] for n in api.call("GET", "/api/v1/nodes")["items"]}
    wanted = [i for i in range(count) if f"bench-gpu-{i:04d}" not in have]
    t0 = time.monotonic()
    parallel(threads, wanted, lambda i: api.call("POST", "/api/v1/nodes", node_manifest(i)))

    def ready():
        nodes = api.call("GET", "/api/v1/nodes?labelSelector=type%3Dkwok")["items"]
        n = 0
        for node in nodes:
            if not node["metadata"]["name"].startswith("bench-gpu-"):
                continue
            conditions = node.get("status", {}).get("conditions", [])
            taints = node.get("spec", {}).get("taints") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) and not taints:
                n += 1
        return n >= count
    if not wait_until(f"{count} nodes Ready and untainted", ready, 300, every=1):
        die("the nodes did not become Ready (is kwok running?)")
    log(f"{count} nodes Ready in {time.monotonic() - t0:.1f} s ({len(wanted)} created)")


def delete_all_pods(api, watch, threads):
    names = sorted(watch.snapshot()[2])
    parallel(threads, names, lambda n: api.call(
        "DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{n}?gracePeriodSeconds=0",
        ok=(200, 202, 404)))
    wait_until("the namespace's pods to go", lambda: not watch.snapshot()[2], 300)


def whole_free_nodes(node_of, nodes):
    used = {}
    for node in node_of.values():
        used[node] = used.get(node, 0) + 1
    return sum(1 for i in range(nodes) if used.get(f"bench-gpu-{i:04d}", 0) == 0)


def percentile(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, max(0, int(round(q * (len(values) - 1)))))]


class Allot:
    def __init__(self, binary, state, port, data_dir):
        self.binary, self.state, self.port, self.data_dir = binary, state, port, data_dir
        self.process = None

    def start(self, gpus):
        shutil.rmtree(self.data_dir, ignore_errors=True)
        os.makedirs(self.data_dir)
        policy = os.path.join(self.data_dir, "..", "bench-k8s-policy.yaml")
        with open(policy, "w") as f:
            f.write("priority_classes: [{name: normal, value: 0, preemptible: true}]\n"
                    "default_priority_class: normal\n"
                    f"projects:\n  - name: {NAMESPACE}\n"
                    f"    quotas: [{{model: {MODEL}, guaranteed: {gpus}}}]\n")
        self.log = open(os.path.join(self.data_dir, "..", "bench-k8s-allot.log"), "w")
        self.process = subprocess.Popen(
            [self.binary, "serve", "--backend", "kubernetes",
             "--kubeconfig", os.path.join(self.state, "allot.kubeconfig"),
             "--policy", policy, "--telemetry", "none", "--data-dir", self.data_dir,
             "--listen", f"127.0.0.1:{self.port}", "--url", f"http://127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def cluster_script(env, verb):
    subprocess.run(["bash", os.path.join(REPO, "scripts", "k8s-cluster.sh"), verb], env=env,
                   check=True, stdout=subprocess.DEVNULL)


# kube-scheduler as it comes, and with its API client's rate limit (QPS 50, burst 100) raised.
SCHEDULER_ARGS = {
    "kube-scheduler": "",
    "kube-scheduler-qps1000": "--kube-api-qps=1000 --kube-api-burst=2000",
}


def run_arm(arm, api, args, env, allot):
    scheduler = "allot" if arm == "allot" else "default-scheduler"
    env = dict(env, K8S_SCHEDULER_ARGS=SCHEDULER_ARGS.get(arm, ""))
    rng = random.Random(args.seed)
    gpus = args.nodes * GPUS_PER_NODE
    backlog = int(gpus * 0.6)
    churn_delete = int(gpus * 0.3)
    churn_create = args.pods - backlog
    watch = Watch(api)
    delete_all_pods(api, watch, args.threads)
    # Names new to each arm: kwok finishes the previous arm's deletes late, by name, and would
    # delete a new pod that took an old one's name.
    tag = os.urandom(3).hex()
    names = [f"p{tag}-{i:05d}" for i in range(args.pods)]
    created_at = {}

    def create(name):
        api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod_manifest(name, scheduler))
        created_at[name] = time.monotonic()

    rows = []
    # Backlog: created with no scheduler running, then the scheduler starts.
    t0 = time.monotonic()
    parallel(args.threads, names[:backlog], create)
    log(f"{arm}: {backlog} pods created in {time.monotonic() - t0:.1f} s")
    started = time.monotonic()
    if arm == "allot":
        allot.start(gpus)
    else:
        cluster_script(env, "scheduler-start")
    all_bound = wait_until(f"{arm} to bind the backlog",
                           lambda: len(watch.snapshot()[0]) >= backlog, args.timeout)
    bound_at, node_of, _ = watch.snapshot()
    times = sorted(bound_at[n] for n in names[:backlog] if n in bound_at)
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
    rows.append({
        "arm": arm, "phase": "backlog", "pods": backlog, "bound": len(times),
        "rate": rate, "first_s": (times[0] - started) if times else float("nan"),
        "p50": float("nan"), "p99": float("nan"),
        "whole_free": whole_free_nodes(node_of, args.nodes)})
    # Churn: a seeded share of the bound pods deleted, then the rest created while it runs.
    if all_bound:
        victims = rng.sample(sorted(node_of), churn_delete)
        parallel(args.threads, victims, lambda n: api.call(
            "DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{n}?gracePeriodSeconds=0",
            ok=(200, 202, 404)))
        wait_until("the deleted pods to go",
                   lambda: not (set(victims) & watch.snapshot()[2]), 120)
        t1 = time.monotonic()
        parallel(args.threads, names[backlog:], create)
        created_s = time.monotonic() - t1
        wait_until(f"{arm} to bind the churn pods",
                   lambda: all(n in watch.snapshot()[0] for n in names[backlog:]), args.timeout)
        bound_at, node_of, _ = watch.snapshot()
        delays = [bound_at[n] - created_at[n] for n in names[backlog:] if n in bound_at]
        times = sorted(bound_at[n] for n in names[backlog:] if n in bound_at)
        rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
        log(f"{arm}: {churn_create} pods created in {created_s:.1f} s "
            f"({churn_create / created_s:.0f}/s)")
        rows.append({
            "arm": arm, "phase": "churn", "pods": churn_create, "bound": len(delays),
            "rate": rate, "first_s": float("nan"),
            "p50": percentile(delays, 0.5), "p99": percentile(delays, 0.99),
            "whole_free": whole_free_nodes(node_of, args.nodes)})
    if arm == "allot":
        allot.stop()
    else:
        cluster_script(env, "scheduler-stop")
    delete_all_pods(api, watch, args.threads)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--allot", default=os.path.join(REPO, "target", "release", "allot"),
                        help="the allot binary (default: target/release/allot)")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10000,
                        help="pods per arm (more than 60 %% of the GPUs)")
    parser.add_argument("--arms", default="kube-scheduler,kube-scheduler-qps1000,allot",
                        help="comma-separated: " + ", ".join([*SCHEDULER_ARGS, "allot"]))
    parser.add_argument("--threads", type=int, default=16, help="parallel API calls")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per phase")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--allot-port", type=int, default=7391)
    parser.add_argument("--json", help="also write the rows here as JSON")
    args = parser.parse_args()
    state = os.environ.get("ALLOT_K8S_DIR", "/tmp/allot-k8s")
    port = int(os.environ.get("API_PORT", "16443"))
    if not os.path.exists(os.path.join(state, "admin.token")):
        die(f"no cluster state in {state}: run scripts/k8s-cluster.sh up first (same ALLOT_K8S_DIR)")
    if os.path.exists(os.path.join(state, "run", "kube-scheduler.pid")):
        die("kube-scheduler runs; start the cluster without it (K8S_WITH_SCHEDULER=0)")
    # The churn phase ends with pods - 30 % of the GPUs alive: at most every GPU.
    if not args.nodes * GPUS_PER_NODE * 0.6 < args.pods <= args.nodes * GPUS_PER_NODE * 1.3:
        die("--pods must be more than 60 % and at most 130 % of the GPUs (nodes x 8)")
    if "allot" in args.arms and not os.access(args.allot, os.X_OK):
        die(f"{args.allot}: no allot binary (cargo build --release -p allot)")
    unknown = [a for a in args.arms.split(",") if a != "allot" and a not in SCHEDULER_ARGS]
    if unknown:
        die(f"--arms: unknown arm {unknown[0]!r}; the arms are " + ", ".join([*SCHEDULER_ARGS, "allot"]))
    api = Api(state, port)
    env = dict(os.environ, ALLOT_K8S_DIR=state, API_PORT=str(port))
    try:
        api.call("POST", "/api/v1/namespaces",
                 {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
                 ok=(201, 409))
        ensure_nodes(api, args.nodes, args.threads)
        work = tempfile.mkdtemp(prefix="bench-k8s-")
        allot = Allot(os.path.abspath(args.allot), state, args.allot_port, os.path.join(work, "data"))
        rows = []
        for arm in args.arms.split(","):
            try:
                rows += run_arm(arm, api, args, env, allot)
            finally:
                allot.stop()
        print(f"{args.nodes} nodes x {GPUS_PER_NODE} GPUs, {args.pods} single-GPU pods per arm, "
              f"seed {args.seed}")
        print(f"{'arm':<15} {'phase':<8} {'pods':>6} {'bound':>6} {'bound/s':>8} "
              f"{'first s':>8} {'p50 s':>7} {'p99 s':>7} {'whole nodes free':>17}")
        for r in rows:
            print(f"{r['arm']:<15} {r['phase']:<8} {r['pods']:>6} {r['bound']:>6} "
                  f"{r['rate']:>8.1f} {r['first_s']:>8.2f} {r['p50']:>7.2f} {r['p99']:>7.2f} "
                  f"{r['whole_free']:>17}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        print(f"(allot's log: {work}/bench-k8s-allot.log)")
    except RuntimeError as e:
        die(str(e))


if __name__ == "__main__":
    main()
