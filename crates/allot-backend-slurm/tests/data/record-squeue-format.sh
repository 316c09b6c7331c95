#!/usr/bin/env bash
# Records squeue-format.txt (the `squeue --Format` listing the backend polls, with the fields
# of parse::SQUEUE_FORMAT), scontrol-job-details.txt (one running job's allocation) and
# jobcomp.log (the same jobs' lines in the job completion log) from the cluster of
# scripts/slurm-cluster.sh: jobs that completed, failed (exit 3), were cancelled while
# running, trapped TERM (exit 143), were requeued then cancelled, one running on two nodes,
# one held with a `|` in its name and comment, one requeued held (`scontrol requeuehold`), a
# foreign pending job, and two held ones asking GPUs per job (`--gpus`) and per task
# (`--gpus-per-task`). Cancels every job it submitted.
set -euo pipefail
cd "$(dirname "$0")"
export SLURM_CONF=${SLURM_CONF:-${ALLOT_SLURM_DIR:-/tmp/allot-slurm}/etc/slurm.conf}
FORMAT=$(grep -A2 'pub const SQUEUE_FORMAT' ../../src/parse.rs | tr -d '\n' \
  | sed -E 's/.*= "//; s/\\ +//g; s/";.*//')
waitstate() { for _ in $(seq 1 120); do [ "$(squeue -h -j "$1" -o %T 2>/dev/null)" = "$2" ] && return 0; sleep 0.5; done; echo "FAIL $1 not $2" >&2; return 1; }
sb() { sbatch --parsable -o /dev/null "$@"; }
ok=$(sb -J allot-1.1 --comment allot:1.1 -A research --nodelist=node1 --gres=gpu:h100:1 --wrap true)
failed=$(sb -J allot-2.1 --comment allot:2.1 -A research --nodelist=node1 --wrap 'exit 3')
killed=$(sb -J allot-3.1 --comment allot:3.1 -A research --nodelist=node3 --wrap 'exec sleep 300')
trapped=$(sb -J foreign-trap -A nlp --nodelist=node4 --wrap 'trap "exit 143" TERM; sleep 300 & wait')
requeued=$(sb -J allot-5.1 --comment allot:5.1 -A vision --nodelist=node2 --wrap 'sleep 300')
running=$(sb -J allot-77.1 --comment allot:77.1 -A vision -N 2 --nodelist=node1,node2 --gres=gpu:h100:4 --wrap 'srun sleep 300')
held=$(sb --hold -J 'odd|name' --comment 'a|comment' -A research --gres=gpu:h100:8 --wrap 'sleep 300')
rqheld=$(sb -J allot-6.1 --comment allot:6.1 -A vision --nodelist=node3 --gres=gpu:h100:2 --wrap 'sleep 300')
pending=$(sb -J notebook -A nlp --begin=now+600 --gres=gpu:h100:2 -N 2 --wrap 'sleep 300')
perjob=$(sb --hold -J per-job -A nlp -N 2 --gpus=h100:4 --wrap 'sleep 300')
pertask=$(sb --hold -J per-task -A nlp -N 1 -n 3 --gpus-per-task=1 --wrap 'sleep 300')
for j in "$killed" "$trapped" "$requeued" "$running" "$rqheld"; do waitstate "$j" RUNNING; done
scancel --signal=KILL --full "$killed"
scancel --signal=TERM --full "$trapped"
scontrol update jobid="$requeued" requeue=1; scontrol requeue "$requeued"; waitstate "$requeued" PENDING
scancel "$requeued"
scontrol update jobid="$rqheld" requeue=1; scontrol requeuehold "$rqheld"; waitstate "$rqheld" PENDING
sleep 2
ids="$ok|$failed|$killed|$trapped|$requeued|$running|$held|$pending|$rqheld|$perjob|$pertask"
squeue --noheader --states=all --Format="$FORMAT" | grep -E "^($ids)\|" > squeue-format.txt
# The two-node GPU job's allocation as `scontrol show job -d` gives it (parse_job_details).
scontrol --oneliner show job --details "$running" > scontrol-job-details.txt
scancel "$running" "$held" "$pending" "$rqheld" "$perjob" "$pertask" 2>/dev/null || true
# The same jobs' lines in the job completion log (jobcomp/filetxt), once all ended.
sleep 2
grep -E "^JobId=($ids) " "$(dirname "$(dirname "$SLURM_CONF")")/log/jobcomp.log" > jobcomp.log
echo "recorded squeue-format.txt: ok=$ok failed=$failed killed=$killed trapped=$trapped requeued=$requeued running=$running held=$held pending=$pending rqheld=$rqheld perjob=$perjob pertask=$pertask"
