#!/usr/bin/env python3
"""allot against plain Slurm on the project's Slurm test cluster (issue 20): the same slice of the
shared Philly trace, run once under plain Slurm (backfill, FIFO priority, no pre-emption) and
once through `allot serve --backend slurm`, then one table of what each arm's jobs saw.

    sudo bash scripts/slurm-cluster.sh up
    export SLURM_CONF=/tmp/allot-slurm/etc/slurm.conf
    python3 scripts/bench-slurm-vs-allot.py --allot target/release/allot [--limit 60]

The slice: data rows 58500-58749 of philly.csv (0-based, header not counted): 226 x 1 GPU,
7 x 2, 7 x 4, 6 x 8 and 4 jobs of 16 GPUs (two nodes of 8). Submit times and durations are
divided by 55 (durations at least 3 s, at most 90 s): 420 s of arrivals, an offered load of
1.33 x the cluster's 32 GPUs. The trace's seven virtual clusters become three accounts in one
cohort: the largest (6214e9) `research`, guaranteed 16 GPUs; the others, in order of size,
alternately `team-a` and `team-b`, guaranteed 8 each. Each job is `sleep DURATION`.

Both arms are measured from Slurm's own accounting (sacct, one line per run): a job's queue
delay is its first run's start less the time it was submitted (to Slurm, or to allot); GPU
time lost to pre-emption is every run but a job's last one (allot requeues from scratch: the
trace's jobs do not checkpoint); allocation is GPU-seconds of all runs over 32 GPUs x the
makespan (first submission to last end). Plain Slurm needs time limits for backfill: each
job asks its duration rounded up to whole minutes plus one.

Nothing here is timed against a limit: it prints figures. It needs the test cluster up, with
nothing else running on it; it cancels what it submitted if interrupted.
"""

import argparse
import collections
import csv
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

from allot_bench import start_serve, stop_serve

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACE = os.path.join(REPO, "..", "shared", "traces", "philly-pollux", "philly.csv")
GPUS_PER_NODE = 8
CLUSTER_GPUS = 32
GUARANTEED = {"research": 16, "team-a": 8, "team-b": 8}


def slice_jobs(path, first, count, compress, floor_s, cap_s):
    """The trace's rows [first, first + count) as jobs: offset and duration in seconds."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))[first:first + count]
    if len(rows) < count:
        sys.exit(f"{path}: has {len(rows)} rows from {first}, not {count}")
    stamps = [time.mktime(time.strptime(r["timestamp"], "%Y-%m-%d %H:%M:%S")) for r in rows]
    sizes = {}
    for r in rows:
        sizes[r["cluster"]] = sizes.get(r["cluster"], 0) + 1
    order = sorted(sizes, key=lambda vc: (-sizes[vc], vc))
    account = {order[0]: "research"}
    for i, vc in enumerate(order[1:]):
        account[vc] = "team-a" if i % 2 == 0 else "team-b"
    jobs = []
    for i, (r, at) in enumerate(zip(rows, stamps)):
        gpus = int(r["num_gpus"])
        nodes = max(1, math.ceil(gpus / GPUS_PER_NODE))
        if gpus % nodes:
            sys.exit(f"row {first + i}: {gpus} GPUs do not split over {nodes} nodes")
        duration = min(max(float(r["duration"]) / compress, floor_s), cap_s)
        jobs.append({
            "i": i,
            "offset_s": (at - stamps[0]) / compress,
            "duration_s": round(duration, 1),
            "gpus": gpus,
            "nodes": nodes,
            "per_node": gpus // nodes,
            "account": account[r["cluster"]],
        })
    return jobs


def run(args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw).stdout


def sacct_runs(pattern, since):
    """Every run of every job whose name matches `pattern` (its group `job` names the job):
    (job, submit, start, end, state, gpus)."""
    env = dict(os.environ, SLURM_TIME_FORMAT="%s")
    out = run(["sacct", "-a", "-X", "-n", "-P", "--duplicates", "-S", time.strftime(
        "%Y-%m-%dT%H:%M:%S", time.localtime(since - 5)), "-o",
        "JobName,Submit,Start,End,State,AllocTRES"], env=env)
    runs = []
    for line in out.splitlines():
        name, submit, start, end, state, tres = line.split("|")
        m = re.fullmatch(pattern, name)
        # Runs of an earlier arm or bench on the same cluster are not this one's.
        if not m or not submit.isdigit() or int(submit) < since - 1:
            continue
        gpus = sum(int(g) for g in re.findall(r"gres/gpu=(\d+)", tres))
        as_int = lambda v: int(v) if v.isdigit() else None
        runs.append((m.group("job"), as_int(submit), as_int(start), as_int(end), state, gpus))
    return runs


def wait_until(offset_s, t0):
    delay = t0 + offset_s - time.time()
    if delay > 0:
        time.sleep(delay)


def plain_slurm(jobs):
    """Arm 1: sbatch each job at its time; wait for all of them to end."""
    t0 = time.time()
    submitted = {}
    for j in jobs:
        wait_until(j["offset_s"], t0)
        limit_min = time_limit_min(j)
        name = f"plain-{j['i']}"
        run(["sbatch", "--parsable", "-p", "batch", "-A", j["account"], "-J", name,
             "-N", str(j["nodes"]), f"--gres=gpu:{j['per_node']}", f"--time={limit_min}",
             "-o", "/dev/null", "--wrap", f"sleep {j['duration_s']}"])
        submitted[name] = time.time()
    while any(n.startswith("plain-") for n in run(["squeue", "-h", "-o", "%j"]).split()):
        time.sleep(2)
    time.sleep(3)  # slurmdbd writes the last ends
    runs = sacct_runs(r"(?P<job>plain-\d+)", t0)
    # Slurm's own submit time (whole seconds, as its start), not the moment sbatch returned.
    for job, submit, *_ in runs:
        if submit is not None:
            submitted[job] = min(submitted.get(job, submit), submit)
    return submitted, runs, t0


def time_limit_min(job):
    """The time limit a job asks, in minutes: its duration rounded up, plus one."""
    return math.ceil(job["duration_s"] / 60) + 1


# The one project of `--one-queue` (an account of the test cluster).
ONE_QUEUE = "research"


def allot_arm(jobs, allot, reserve_after=None, time_limits=False, poll_max=None,
              reclaim_after=None, hold_quota=False, per_model_max=None, one_queue=False,
              keep_log=False):
    """Arm 2: allot serve --backend slurm; each job through `allot submit` at its time. With
    `reserve_after` (a duration), the policy holds nodes for requests waiting that long; with
    `time_limits`, each job asks Slurm's arm's time limit as its max runtime (backfill); with
    `poll_max` (a duration), allot looks at the queue at least that often; with
    `reclaim_after` (a duration), a claimant reclaims from borrowers only after that wait; with
    `hold_quota`, the reservations hold quota too, and `per_model_max` bounds them per model.
    With `one_queue`, every job goes to one project (`research`, Slurm account of that name)
    guaranteed the whole cluster: plain Slurm's policy, one FIFO queue without accounts'
    guarantees, in allot's terms (`examples/philly-one-queue-policy.yaml`). With `keep_log`,
    the daemon takes no snapshot during the run, so its data directory keeps the whole log
    (each input and cycle, in order) for replaying the run afterwards."""
    data = tempfile.mkdtemp(prefix="allot-bench-")
    policy = os.path.join(data, "policy.yaml")
    with open(policy, "w") as f:
        if reserve_after:
            hold = ", hold_quota: true" if hold_quota else ""
            depth = f", per_model_max: {per_model_max}" if per_model_max else ""
            f.write(f"reservations: {{after: {reserve_after}{depth}{hold}}}\n")
        f.write("preemption:\n  mode: requeue\n"
                + (f"  reclaim_after: {reclaim_after}\n" if reclaim_after else "")
                + "restart_cost: 1m\n"
                "priority_classes:\n  - {name: normal, value: 0, preemptible: true}\n"
                "default_priority_class: normal\nprojects:\n")
        guaranteed = {ONE_QUEUE: CLUSTER_GPUS} if one_queue else GUARANTEED
        for name, g in guaranteed.items():
            f.write(f"  - name: {name}\n    cohort: lab\n    quotas:\n"
                    f"      - {{model: h100, guaranteed: {g}, borrow_limit: {CLUSTER_GPUS - g}}}\n")
    serve_args = ["--slurm-poll-max", poll_max] if poll_max else []
    if keep_log:
        serve_args += ["--snapshot-every", "100000000"]
    serve, env = start_serve(allot, 7399, data, policy, serve_args)
    token = env["ALLOT_TOKEN"]
    try:
        t0 = time.time()
        submitted = {}
        for j in jobs:
            wait_until(j["offset_s"], t0)
            project = ONE_QUEUE if one_queue else j["account"]
            argv = [allot, "submit", "--project", project, "--gpus", str(j["per_node"]),
                    "--name", f"job-{j['i']}"]
            if j["nodes"] > 1:
                argv += ["--members", str(j["nodes"])]
            if time_limits:
                argv += ["--max-runtime", f"{time_limit_min(j)}m"]
            wid = run(argv + ["--", "sleep", str(j["duration_s"])], env=env).strip()
            submitted[wid] = time.time()
        final = {"succeeded", "failed", "cancelled", "rejected"}
        while True:
            listed = json.loads(run([allot, "ls", "--output", "json"], env=env))
            items = listed if isinstance(listed, list) else listed.get("workloads", [])
            if len(items) >= len(jobs) and all(w["state"] in final for w in items):
                break
            time.sleep(2)
        request = urllib.request.Request("http://127.0.0.1:7399/api/v1/report",
                                         headers={"Authorization": f"Bearer {token}"})
        report = json.loads(urllib.request.urlopen(request).read())
        time.sleep(3)
        # allot names its Slurm jobs `allot<daemon id>-WORKLOAD.ATTEMPT`; a job here is
        # `allot-WORKLOAD`, submitted when `allot submit` was.
        runs = [(f"allot-{job}", *rest) for job, *rest in
                sacct_runs(r"allot[0-9a-z]*-(?P<job>\d+)\.\d+", t0)]
        return ({f"allot-{wid}": at for wid, at in submitted.items()}, runs, t0, report,
                data)
    finally:
        stop_serve(serve, data)


# A daemon line, after its time stamp (none under journald).
STOPPED = re.compile(r"^(?:\S+ )?allot: stopped #(?P<id>\d+) (?P<victim>job-\d+) \((?P<project>[^)]*)\): "
                     r"(?P<mode>\w+) for (?P<claimant>\S+): .*\[(?P<code>\w+)\]$")


def stops_said(data):
    """The pre-emptions the daemon said it decided (`allot: stopped …` in its log stream):
    (victim, victim's project, claimant, reason code, victim's workload id), in order."""
    out = []
    with open(os.path.join(data, "serve.err")) as f:
        for line in f:
            m = STOPPED.match(line.strip())
            if m:
                out.append((m["victim"], m["project"], m["claimant"], m["code"], m["id"]))
    return out


def restarts_seen(runs):
    """Per job, how many of its Slurm runs started and were followed by another (what the
    table counts as pre-emptions)."""
    per_job = {}
    for job, _submit, start, _end, _state, _gpus in runs:
        if start:
            per_job[job] = per_job.get(job, 0) + 1
    return {job: n - 1 for job, n in per_job.items() if n > 1}


def print_stops(said, runs, jobs):
    """The daemon's pre-emptions beside Slurm's restarts: by reason, by the victim's and the
    claimant's size, and the restarts the daemon did not say (or said stops that never ran)."""
    gpus = {f"job-{j['i']}": j["per_node"] * j["nodes"] for j in jobs}
    by = lambda key: sorted(collections.Counter(key(s) for s in said).items())
    print(f"allot said {len(said)} pre-emptions; by reason: {by(lambda s: s[3])}")
    print(f"  by victim's GPUs: {by(lambda s: gpus.get(s[0]))}; "
          f"by claimant's GPUs: {by(lambda s: gpus.get(s[2]))}")
    print(f"  by victim's project: {by(lambda s: s[1])}")
    restarts = restarts_seen(runs)
    said_per_job = collections.Counter(f"allot-{s[4]}" for s in said)
    print(f"  Slurm saw {sum(restarts.values())} restarts of {len(restarts)} jobs; "
          f"allot said stops of {len(said_per_job)} jobs")
    for job in sorted(set(restarts) | set(said_per_job)):
        if restarts.get(job, 0) != said_per_job.get(job, 0):
            print(f"  {job}: {restarts.get(job, 0)} restarts on Slurm, "
                  f"{said_per_job.get(job, 0)} stops said by allot")


def figures(label, submitted, runs, jobs_total):
    """One arm's row from its runs (grouped per job) and submit times."""
    per_job = {}
    for job, _submit, start, end, state, gpus in runs:
        per_job.setdefault(job, []).append((start, end, state, gpus))
    # Each started job's wait and GPUs (in `--json`: which jobs make the tail).
    by_job, lost, used = {}, 0.0, 0.0
    first_submit = min(submitted.values())
    last_end = 0
    for job, job_runs in per_job.items():
        job_runs.sort(key=lambda r: (r[0] or 0))
        started = [r for r in job_runs if r[0]]
        if not started:
            continue
        sub = submitted.get(job)
        if sub is None:
            continue
        by_job[job] = {"wait_s": started[0][0] - sub, "gpus": max(r[3] for r in job_runs)}
        for k, (start, end, _state, g) in enumerate(started):
            seconds = (end or start) - start
            used += g * seconds
            if k < len(started) - 1:
                lost += g * seconds
            last_end = max(last_end, end or 0)
    waits = sorted(j["wait_s"] for j in by_job.values())
    big_waits = [j["wait_s"] for j in by_job.values() if j["gpus"] >= 8]
    pct = lambda v, p: v[min(len(v) - 1, max(0, math.ceil(len(v) * p / 100) - 1))] if v else float("nan")
    makespan = last_end - first_submit
    return {
        "arm": label,
        "jobs": len(waits),
        "of": jobs_total,
        "wait_p50_s": pct(waits, 50),
        "wait_p95_s": pct(waits, 95),
        "wait_p99_s": pct(waits, 99),
        "wait_8plus_mean_s": sum(big_waits) / len(big_waits) if big_waits else float("nan"),
        "wait_8plus_max_s": max(big_waits) if big_waits else float("nan"),
        "makespan_s": makespan,
        "allocation_pct": 100.0 * used / (CLUSTER_GPUS * makespan) if makespan > 0 else 0.0,
        "preemptions": sum(restarts_seen(runs).values()),
        "lost_pct": 100.0 * lost / used if used else 0.0,
        "jobs_waits": by_job,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--allot", default=os.path.join(REPO, "target", "release", "allot"))
    p.add_argument("--trace", default=TRACE)
    p.add_argument("--first", type=int, default=58500)
    p.add_argument("--limit", type=int, default=250, help="jobs of the slice to run")
    p.add_argument("--compress", type=float, default=55.0)
    p.add_argument("--arms", default="slurm,allot")
    p.add_argument("--json", help="also write the figures here, with each job's wait")
    p.add_argument("--keep-log", action="store_true",
                   help="allot arm: keep the daemon's whole log (no snapshots during the run)")
    p.add_argument("--reserve-after", metavar="DURATION",
                   help="allot arm: policy `reservations: {after: DURATION}`")
    p.add_argument("--time-limits", action="store_true",
                   help="allot arm: each job asks the Slurm arm's time limit as its max runtime")
    p.add_argument("--slurm-poll-max", metavar="DURATION",
                   help="allot arm: `allot serve --slurm-poll-max` (allot's default: 5s)")
    p.add_argument("--reclaim-after", metavar="DURATION",
                   help="allot arm: policy `preemption: {reclaim_after: DURATION}`")
    p.add_argument("--hold-quota", action="store_true",
                   help="allot arm, with --reserve-after: `reservations: {hold_quota: true}`")
    p.add_argument("--per-model-max", type=int, metavar="N",
                   help="allot arm, with --reserve-after: `reservations: {per_model_max: N}`")
    p.add_argument("--one-queue", action="store_true",
                   help="allot arm: every job in one project guaranteed the cluster (plain "
                        "Slurm's policy in allot's terms) instead of three with guarantees")
    a = p.parse_args()
    if a.hold_quota and not a.reserve_after:
        sys.exit("--hold-quota: give --reserve-after too (quota is held by reservations)")
    if not os.environ.get("SLURM_CONF"):
        sys.exit("SLURM_CONF is not set: `sudo bash scripts/slurm-cluster.sh up` and "
                 "`export SLURM_CONF=/tmp/allot-slurm/etc/slurm.conf` first")
    jobs = slice_jobs(a.trace, a.first, a.limit, a.compress, 3.0, 90.0)
    rows = []
    for arm in a.arms.split(","):
        started = time.time()
        if arm == "slurm":
            submitted, runs, _ = plain_slurm(jobs)
            rows.append(figures("plain Slurm (backfill)", submitted, runs, len(jobs)))
        elif arm == "allot":
            submitted, runs, _, _report, data = allot_arm(jobs, a.allot, a.reserve_after,
                                                          a.time_limits, a.slurm_poll_max,
                                                          a.reclaim_after, a.hold_quota,
                                                          a.per_model_max, a.one_queue,
                                                          a.keep_log)
            label = "allot, one queue" if a.one_queue else "allot (requeue pre-emption)"
            rows.append(figures(label, submitted, runs, len(jobs)))
            print_stops(stops_said(data), runs, jobs)
        else:
            sys.exit(f"--arms: unknown arm {arm!r}; use slurm, allot or both")
        print(f"{arm}: {time.time() - started:.0f} s", file=sys.stderr)
    header = ("arm", "jobs", "wait_p50_s", "wait_p95_s", "wait_p99_s", "wait_8plus_mean_s",
              "wait_8plus_max_s", "makespan_s", "allocation_pct", "preemptions", "lost_pct")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        cells = [f"{r[h]:.1f}" if isinstance(r[h], float) else str(r[h]) for h in header]
        print("| " + " | ".join(cells) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
