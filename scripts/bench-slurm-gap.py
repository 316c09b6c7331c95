#!/usr/bin/env python3
"""How long GPUs stay idle between one job's end and the next queued job's start on the
project's Slurm test cluster: plain Slurm against `allot serve --backend slurm`.

    sudo bash scripts/slurm-cluster.sh up
    export SLURM_CONF=/tmp/allot-slurm/etc/slurm.conf
    python3 scripts/bench-slurm-gap.py --allot target/release/allot [--spacing 2.5] [-- SERVE ARGS]

Each arm fills the cluster's 32 GPUs with one-GPU jobs that end one at a time, SPACING seconds
apart (the first 15 s after the arm begins, at set wall-clock times however long the
submissions take; SPACING 0: all at once, so that 32 queued jobs start in one wave), and queues
32 more one-GPU jobs behind them, each running past the last end. Every job writes
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
import subprocess
import sys
import tempfile
import time

from allot_bench import start_serve, stop_serve

CLUSTER_GPUS = 32
FIRST_END_S = 15.0


def run(argv, env=None):
    return subprocess.run(argv, check=True, capture_output=True, text=True, env=env).stdout


def job_command(stamps, name, seconds=None, until=None):
    """A job that stamps its start, sleeps `seconds` (or until the wall-clock time `until`,
    seconds since the epoch), and stamps its end."""
    if until is not None:
        pause = (f"$(awk -v e={until:.3f} -v n=$(date +%s.%N) "
                 "'BEGIN {d = e - n; print (d > 0 ? d : 0)}')")
    else:
        pause = f"{seconds:.2f}"
    return (f"date +%s.%N > {stamps}/{name}.start; sleep {pause}; "
            f"date +%s.%N > {stamps}/{name}.end")


def read_stamps(stamps, prefix, kind):
    out = []
    for path in glob.glob(f"{stamps}/{prefix}-{kind[0]}*.{kind[1]}"):
        with open(path) as f:
            out.append(float(f.read()))
    return sorted(out)


def arm(label, submit, stamps, spacing):
    """Submits the running jobs (ending `spacing` apart, at set wall-clock times, however
    long the submissions take) and the queued ones through `submit(name, command)`, waits for
    every end, returns the gaps."""
    t0 = time.time()
    running = [(f"{label}-r{i}", None, t0 + FIRST_END_S + i * spacing)
               for i in range(CLUSTER_GPUS)]
    # The i-th queued job starts at about the i-th end and runs past the last one, so that
    # every GPU a queued job takes stays taken and each end frees exactly one.
    queued = [(f"{label}-q{i}", (CLUSTER_GPUS - 1 - i) * spacing + 3.0, None)
              for i in range(CLUSTER_GPUS)]
    for name, seconds, until in running + queued:
        submit(name, job_command(stamps, name, seconds, until))
    deadline = time.time() + 120 + FIRST_END_S + CLUSTER_GPUS * spacing
    while not all(os.path.exists(f"{stamps}/{n}.end") and os.path.getsize(f"{stamps}/{n}.end")
                  for n, _, _ in running + queued):
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
    serve, env = start_serve(allot, 7397, data, policy, serve_args)
    try:
        return arm("allot", lambda n, command: run(
            [allot, "submit", "--project", "lab", "--gpus", "1", "--name", n, "--", "sh", "-c",
             command], env=env), stamps, spacing)
    finally:
        stop_serve(serve, data)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--allot", required=True, help="the allot binary")
    p.add_argument("--spacing", type=float, default=2.5,
                   help="seconds between two ends of the running jobs (default 2.5; 0: all "
                   "end at once, and a wave of 32 starts)")
    p.add_argument("serve_args", nargs="*", help="more `allot serve` arguments (after --)")
    a = p.parse_args()
    if not 0 <= a.spacing <= 10:
        sys.exit("--spacing: seconds, from 0 (every end at once) to 10")
    if not os.environ.get("SLURM_CONF"):
        sys.exit("SLURM_CONF is not set: export SLURM_CONF=/tmp/allot-slurm/etc/slurm.conf")
    stamps = tempfile.mkdtemp(prefix="allot-gap-stamps-")
    os.chmod(stamps, 0o777)
    rows = [("plain Slurm", arm("plain", lambda n, command: run(
        ["sbatch", "--gres=gpu:1", "-J", n, "-o", "/dev/null", "--wrap", command]), stamps,
        a.spacing))]
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
