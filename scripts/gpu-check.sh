#!/usr/bin/env bash
# GPU check for issue 7 (not part of CI; run it whenever a machine with an NVIDIA GPU is at hand):
# builds allot, starts one PyTorch process running matrix products ("busy") and one that only
# holds GPU memory ("holder"), runs the NVML collector for 60 s through
# `allot telemetry watch --source nvml`, and prints per-process and per-device classification.
# Expected: busy -> active, holder -> idle-with-memory (and, with two or more GPUs, the holder's
# GPU -> idle-with-memory). Exits 1 if that is not what the collector saw.
#
# Usage: scripts/gpu-check.sh [SECONDS]   Needs: the NVIDIA driver, cargo, python3 with torch (CUDA).
# Note: NVML reports host PIDs; in a container with its own PID namespace they differ from the
# PIDs seen here, and the per-process check then reports them as missing.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_RUN=${1:-60}
command -v nvidia-smi > /dev/null || { echo "nvidia-smi not found: this needs an NVIDIA GPU and driver" >&2; exit 1; }
python3 -c 'import torch; assert torch.cuda.is_available(), "torch sees no CUDA device"' \
  || { echo "python3 with CUDA-enabled torch is needed" >&2; exit 1; }
cargo build --release --locked -p allot
BIN=${CARGO_TARGET_DIR:-target}/release/allot
# CUDA numbers devices fastest-first by default; NVML (and allot) by PCI bus.
export CUDA_DEVICE_ORDER=PCI_BUS_ID
GPUS=$(nvidia-smi -L | grep -c '^GPU ')
HOLDER_GPU=0
[ "$GPUS" -ge 2 ] && HOLDER_GPU=1
echo "GPUs: $GPUS; busy on GPU 0, holder on GPU $HOLDER_GPU"

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2> /dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2> /dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

cat > "$WORK/busy.py" <<'PY'
import torch, time
a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
end = time.time() + float(__import__("sys").argv[1])
while time.time() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
PY
cat > "$WORK/holder.py" <<'PY'
import torch, time, sys
x = torch.empty(4 * 1024**3, dtype=torch.uint8, device="cuda")  # 4 GiB, never used
torch.cuda.synchronize()
time.sleep(float(sys.argv[1]))
PY
RUN_FOR=$((SECONDS_RUN + 30))
CUDA_VISIBLE_DEVICES=0 python3 "$WORK/busy.py" $RUN_FOR & BUSY=$!; PIDS+=($BUSY)
CUDA_VISIBLE_DEVICES=$HOLDER_GPU python3 "$WORK/holder.py" $RUN_FOR & HOLDER=$!; PIDS+=($HOLDER)
echo "busy pid $BUSY, holder pid $HOLDER; warming up 15 s"
sleep 15
"$BIN" telemetry watch --source nvml --seconds "$SECONDS_RUN" --output json > "$WORK/watch.json"
python3 - "$WORK/watch.json" "$BUSY" "$HOLDER" "$HOLDER_GPU" "$GPUS" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
busy, holder, holder_gpu, gpus = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
print(f"{doc['collections']} collections")
for d in doc["devices"]:
    print(f"device {d['device']}: {d['activity']} (signal {d['signal']}, mean {d['mean_permille']} permille, confidence {d['confidence']})")
procs = {p["pid"]: p for p in doc["processes"]}
for p in doc["processes"]:
    print(f"process {p['pid']} on {p['device']}: {p['activity']} (memory {p['memory_used_mib_max']} MiB, max SM util {p['sm_util_permille_max']} permille)")
failures = []
def expect(what, got, want):
    ok = got == want
    print(f"{'ok  ' if ok else 'FAIL'} {what}: {got} (expected {want})")
    if not ok:
        failures.append(what)
expect("busy process", procs.get(busy, {}).get("activity", "missing"), "active")
expect("holder process", procs.get(holder, {}).get("activity", "missing"), "idle-with-memory")
by_index = {d["device"].rsplit("nvidia", 1)[-1]: d for d in doc["devices"]}
expect("GPU 0 (busy)", by_index.get("0", {}).get("activity", "missing"), "active")
if gpus >= 2:
    expect(f"GPU {holder_gpu} (holder only)", by_index.get(str(holder_gpu), {}).get("activity", "missing"), "idle-with-memory")
sys.exit(1 if failures else 0)
PY
echo "gpu check: ok"
