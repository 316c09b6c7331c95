#!/usr/bin/env python3
"""How long GPUs stay idle between one job's end and the next queued job's start on the
project's Slurm test cluster: plain Slurm against `allot serve --backend slurm`.

    sudo bash scripts/slurm-cluster.sh up
    export SLURM_CONF=/tmp/allot-slurm/etc/slurm.conf
    python3 scripts/bench-slurm-gap.py --allot target/release/allot [--spacing 2.5] [-- SERVE ARGS]

Each arm fills the cluster's 32 GPUs with one-GPU jobs that end one at a time, SPACING seconds
apart (the first after 10 s), and queues 32 more one-GPU jobs behind them, each running past
the last end. Every job writes
time stamps itself (its start, its end). The k-th end is paired with the k-th start of the
queued jobs, and the gap is that start less that end. Slurm starts a queued job when one ends;
allot's gate starts nothing allot did not release, so allot's gap is the time it takes to see
the end (its look at `squeue`), decide, submit and release the next job. Ends spaced out let
the look at `squeue` back off between them, as on a cluster of long jobs. The stamps are the
jobs' own clock (this host), so a gap includes Slurm's launch of the batch script.

Nothing here is timed against a limit: it prints figures. It needs the test cluster up, with
nothing else running on it. Arguments after `--` go to `allot serve`.
"""

import argparse
import glob
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

CLUSTER_GPUS = 32
FIRST_END_S = 10.0


def run(argv, env=None):
    return subprocess.run(argv, check=True, capture_output=True, text=True, env=env).stdout


def job_command(stamps, name, seconds):
    return (f"date +%s.%N > {stamps}/{name}.start; sleep {seconds:.2f}; "
            f"date +%s.%N > {stamps}/{name}.end")


def read_stamps(stamps, prefix, kind):
    out = []
    for path in glob.glob(f"{stamps}/{prefix}-{kind[0]}*.{kind[1]}"):
        with open(path) as f:
            out.append(float(f.read()))
    return sorted(out)


def arm(label, submit, stamps, spacing):
    """Submits the running jobs (ending `spacing` apart) and the queued ones through
    `submit(name, seconds)`, waits for every end, returns the gaps."""
    running = [(f"{label}-r{i}", FIRST_END_S + i * spacing) for i in range(CLUSTER_GPUS)]
    # The i-th queued job starts at about the i-th end and runs past the last one, so that
    # every GPU a queued job takes stays taken and each end frees exactly one.
    queued = [(f"{label}-q{i}", (CLUSTER_GPUS - 1 - i) * spacing + 3.0)
              for i in range(CLUSTER_GPUS)]
    for name, seconds in running + queued:
        submit(name, seconds)
    deadline = time.time() + 120 + FIRST_END_S + CLUSTER_GPUS * spacing
    while not all(os.path.exists(f"{stamps}/{n}.end") and os.path.getsize(f"{stamps}/{n}.end")
                  for n, _ in running + queued):
        if time.time() > deadline:
            sys.exit(f"{label}: not every job ended in time; see squeue")
        time.sleep(0.5)
    ends = read_stamps(stamps, label, ("r", "end"))
    starts = read_stamps(stamps, label, ("q", "start"))
    return [s - e for s, e in zip(starts, ends)]


def allot_arm(allot, serve_args, stamps, spacing):
    data = tempfile.mkdtemp(prefix="allot-gap-")
    policy = os.path.join(data, "policy.yaml")
    with open(policy, "w") as f:
        f.write("priority_classes:\n  - {name: normal, value: 0, preemptible: true}\n"
                "default_priority_class: normal\nprojects:\n  - name: lab\n    quotas:\n"
                f"      - {{model: h100, guaranteed: {CLUSTER_GPUS}}}\n")
    serve = subprocess.Popen(
        [allot, "serve", "--backend", "slurm", "--telemetry", "none", "--listen",
         "127.0.0.1:7397", "--data-dir", os.path.join(data, "state"), "--policy", policy]
        + serve_args,
        stdout=subprocess.PIPE, stderr=open(os.path.join(data, "serve.err"), "w"), text=True)
    try:
        token = None
        for line in serve.stdout:
            m = re.search(r"(allot_[A-Za-z0-9_]+)", line)
            if m:
                token = m.group(1)
                break
        if not token:
            sys.exit("allot serve printed no admin token; see " + data)
        env = dict(os.environ, ALLOT_URL="http://127.0.0.1:7397", ALLOT_TOKEN=token)
        return arm("allot", lambda n, secs: run(
            [allot, "submit", "--project", "lab", "--gpus", "1", "--name", n, "--", "sh", "-c",
             job_command(stamps, n, secs)], env=env), stamps, spacing)
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=30)
        print(f"allot arm's data: {data}", file=sys.stderr)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--allot", required=True, help="the allot binary")
    p.add_argument("--spacing", type=float, default=2.5,
                   help="seconds between two ends of the running jobs (default 2.5)")
    p.add_argument("serve_args", nargs="*", help="more `allot serve` arguments (after --)")
    a = p.parse_args()
    if not 0 < a.spacing <= 10:
        sys.exit("--spacing: seconds, more than 0 and at most 10")
    if not os.environ.get("SLURM_CONF"):
        sys.exit("SLURM_CONF is not set: export SLURM_CONF=/tmp/allot-slurm/etc/slurm.conf")
    stamps = tempfile.mkdtemp(prefix="allot-gap-stamps-")
    os.chmod(stamps, 0o777)
    rows = [("plain Slurm", arm("plain", lambda n, secs: run(
        ["sbatch", "--gres=gpu:1", "-J", n, "-o", "/dev/null", "--wrap",
         job_command(stamps, n, secs)]), stamps, a.spacing))]
    time.sleep(3)
    rows.append(("allot " + " ".join(a.serve_args) if a.serve_args else "allot",
                 allot_arm(a.allot, a.serve_args, stamps, a.spacing)))
    print("| arm | gaps | mean s | min s | max s |")
    print("|---|---|---|---|---|")
    for label, gaps in rows:
        print(f"| {label} | {len(gaps)} | {sum(gaps) / len(gaps):.2f} | {min(gaps):.2f} | "
              f"{max(gaps):.2f} |")


if __name__ == "__main__":
    main()
