"""What the Slurm benchmark scripts (`bench-slurm-gap.py`, `bench-slurm-vs-allot.py`) share:
`allot serve --backend slurm` started on a policy, and stopped."""

import os
import re
import signal
import subprocess
import sys


def start_serve(allot, port, data, policy, extra_args=()):
    """Starts `allot serve --backend slurm` on loopback `port` with its state under `data`
    (stderr in `data`/serve.err) and waits for the admin token it prints. Returns the process
    and the environment the `allot` client commands need (ALLOT_URL, ALLOT_TOKEN)."""
    serve = subprocess.Popen(
        [allot, "serve", "--backend", "slurm", "--telemetry", "none", "--listen",
         f"127.0.0.1:{port}", "--data-dir", os.path.join(data, "state"), "--policy", policy]
        + list(extra_args),
        stdout=subprocess.PIPE, stderr=open(os.path.join(data, "serve.err"), "w"), text=True)
    for line in serve.stdout:
        m = re.search(r"(allot_[A-Za-z0-9_]+)", line)
        if m:
            return serve, dict(os.environ, ALLOT_URL=f"http://127.0.0.1:{port}",
                               ALLOT_TOKEN=m.group(1))
    serve.kill()
    sys.exit("allot serve printed no admin token; see " + data)


def stop_serve(serve, data):
    """Stops the daemon as an operator would (SIGTERM) and says where its data is."""
    serve.send_signal(signal.SIGTERM)
    serve.wait(timeout=30)
    print(f"allot arm's data: {data}", file=sys.stderr)
