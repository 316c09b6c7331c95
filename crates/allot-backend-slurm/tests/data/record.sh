#!/usr/bin/env bash
# Records the Slurm 22.05 JSON payloads the parser tests read, from the cluster of
# scripts/slurm-cluster.sh (run `scripts/slurm-cluster.sh up` first, as root).
# Leaves the cluster as it found it: every job cancelled, every node resumed.
set -euo pipefail
cd "$(dirname "$0")"
export SLURM_CONF=${SLURM_CONF:-${ALLOT_SLURM_DIR:-/tmp/allot-slurm}/etc/slurm.conf}
W=$(mktemp -d /tmp/allot-record.XXXX)
waitstate() { for _ in $(seq 1 120); do [ "$(squeue -h -j "$1" -o %T 2>/dev/null)" = "$2" ] && return 0; sleep 0.5; done; echo "FAIL $1 not $2" >&2; return 1; }
sb() { sbatch --parsable -o "$W/%j.out" "$@"; }

# jobs of every state: completed, failed (exit 3), running on 2 nodes, held, requeued, cancelled,
# and a foreign job (not named allot-…) in the unmanaged partition.
done_ok=$(sb -J allot-1.1 --comment allot:1.1 -A research --nodelist=node1 --gres=gpu:h100:1 --wrap true)
failed=$(sb -J allot-2.1 --comment allot:2.1 -A research --nodelist=node1 --gres=gpu:h100:2 --wrap 'exit 3')
running=$(sb -J allot-3.1 --comment allot:3.1 -A vision -N 2 --nodelist=node1,node2 --gres=gpu:h100:4 --wrap 'srun sleep 300')
held=$(sb --hold -J allot-4.1 --comment allot:4.1 -A research --nodelist=node3 --gres=gpu:h100:8 --wrap 'sleep 300')
requeued=$(sb -J allot-5.1 --comment allot:5.1 -A vision --nodelist=node3 --gres=gpu:h100:2 --wrap 'sleep 300')
cancelled=$(sb -J allot-6.1 --comment allot:6.1 -A research --nodelist=node2 --gres=gpu:h100:1 --wrap 'sleep 300')
foreign=$(sb -J train-llm -A nlp -p unmanaged --gres=gpu:h100:3 --wrap 'sleep 300')
foreign2=$(sb -J notebook -A nlp --nodelist=node3 --gres=gpu:h100:1 --wrap 'sleep 300')
waitstate "$running" RUNNING; waitstate "$requeued" RUNNING; waitstate "$cancelled" RUNNING
waitstate "$foreign" RUNNING; waitstate "$foreign2" RUNNING
scancel "$cancelled"
scontrol requeue "$requeued"; waitstate "$requeued" PENDING
sleep 1
squeue --json > squeue-states.json
squeue --noheader --states=all \
  --Format='JobID:|,State:|,Reason:|,exit_code:|,RestartCnt:|,BatchHost:|,NodeList:|,Name:' \
  > squeue-format.txt
sinfo --json > sinfo-idle-mixed.json
scontrol show partition -o > scontrol-partitions.txt

# a drained node and a down node
scontrol update nodename=node3 state=drain reason="allot test: drained"
# A down node: its slurmd stops (ReturnToService=2 would revive a live one at once).
STATE=$(dirname "$(dirname "$SLURM_CONF")")
pid=$(cat "$STATE/run/slurmd-node4.pid"); kill "$pid"
for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
scontrol update nodename=node4 state=down reason="allot test: down"
sleep 1
sinfo --json > sinfo-drained-down.json
squeue --json > squeue-after-down.json

scancel "$done_ok" "$failed" "$running" "$held" "$requeued" "$foreign" "$foreign2" 2>/dev/null || true
for _ in $(seq 1 60); do [ -z "$(squeue -h -t R,CG -o %i)" ] && break; sleep 0.5; done
slurmd -f "$SLURM_CONF" -N node4
scontrol update nodename=node3 state=resume
for _ in $(seq 1 60); do [ "$(sinfo -h -N -t idle -o %N | sort -u | wc -l)" = 4 ] && break; sleep 0.5; done
rm -rf "$W"
echo "recorded: $(ls *.json *.txt | tr '\n' ' ')"
