#!/usr/bin/env bash
# A real Slurm 22.05 (Debian 12) cluster on loopback for allot's Slurm backend tests:
# munged + MariaDB + slurmdbd + slurmctld + NODES x `slurmd -N nodeN`, each node with NODE_GPUS
# fake GPUs of type GPU_TYPE, and allot's submit-time gate (job_submit/lua) on partition
# "gated". slurmdbd keeps accounting in MariaDB with `AccountingStorageTRES=gres/gpu`, so
# `sacct` shows each job's GPUs; the accounts in ACCOUNTS exist for root and allot-user; finished
# jobs' exit codes come from `squeue` while Slurm keeps them (MinJobAge); jobcomp/filetxt
# also writes one line per finished run to $STATE/log/jobcomp.log.
#
#   scripts/slurm-cluster.sh up     # install packages, write configs, start, wait until idle
#   scripts/slurm-cluster.sh down   # stop every daemon it started, by pidfile
#   scripts/slurm-cluster.sh env    # print the SLURM_CONF export for a shell
#
# Everything lives under $ALLOT_SLURM_DIR (default /tmp/allot-slurm); the client commands find
# the cluster through SLURM_CONF=$ALLOT_SLURM_DIR/etc/slurm.conf. Run as root (slurmd runs jobs
# as the submitting user). Based on ../shared/docs/reference/slurm-and-prometheus.md.
set -euo pipefail

STATE=${ALLOT_SLURM_DIR:-/tmp/allot-slurm}
NODES=${NODES:-4}
NODE_CPUS=${NODE_CPUS:-8}
NODE_GPUS=${NODE_GPUS:-8}
GPU_TYPE=${GPU_TYPE:-h100}
CTLD_PORT=${CTLD_PORT:-6817}
# slurmd of nodeN listens on NODE_PORT_BASE+N.
NODE_PORT_BASE=${NODE_PORT_BASE:-17000}
# slurmdbd's port, and MariaDB's (on 127.0.0.1, away from a MySQL the host may run on 3306).
DBD_PORT=${DBD_PORT:-6819}
DB_PORT=${DB_PORT:-13306}
# The Slurm accounts the tests submit under (allot's projects): with slurmdbd, a job's account
# must be one of the user's associations, or Slurm puts the job in the user's default account.
ACCOUNTS=${ACCOUNTS:-nlp,vision,research,physics,team-a,team-b,load}
CONF=$STATE/etc/slurm.conf
GATE_SCRIPT=$(cd "$(dirname "$0")/.." && pwd)/crates/allot-backend-slurm/job_submit.lua

stop_pidfile() {
  local f=$1 p
  [ -s "$f" ] || return 0
  p=$(cat "$f")
  if kill "$p" 2>/dev/null; then
    for _ in $(seq 1 40); do kill -0 "$p" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null || true
  fi
  rm -f "$f"
}

down() {
  for f in "$STATE"/run/slurmd-*.pid; do [ -e "$f" ] && stop_pidfile "$f"; done
  stop_pidfile "$STATE/run/slurmctld.pid"
  stop_pidfile "$STATE/run/slurmdbd.pid"
  stop_pidfile "$STATE/run/mariadb.pid"
  # munged only if this script started it (another cluster on the host may share it).
  stop_pidfile "$STATE/run/munged.pid"
  echo "slurm-cluster: stopped (state kept in $STATE)"
}

install_packages() {
  local need=""
  for b in munged slurmctld slurmd sbatch slurmdbd mariadbd; do command -v "$b" >/dev/null || need=yes; done
  [ -z "$need" ] && return 0
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  # policy-rc.d (exit 101) keeps the postinsts from starting the packaged services.
  [ -e /usr/sbin/policy-rc.d ] || {
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
  }
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends munge slurm-wlm slurmctld slurmd slurm-client slurmdbd \
    mariadb-server >/dev/null
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return 0; fi   # one is running
  [ -s /etc/munge/munge.key ] || {
    mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key
  }
  install -d -o munge -g munge -m 0755 /run/munge
  runuser -u munge -- /usr/sbin/munged --num-threads=4
  for _ in $(seq 1 40); do [ -s /run/munge/munged.pid ] && break; sleep 0.1; done
  cp /run/munge/munged.pid "$STATE/run/munged.pid"
  munge -n | unmunge >/dev/null
}

write_configs() {
  install -d -m 0755 "$STATE/etc" "$STATE/run" "$STATE/log" "$STATE/ctld" "$STATE/fakegpu"
  for n in $(seq 1 "$NODES"); do install -d -m 0755 "$STATE/spool/node$n"; done
  # gres/gpu drops GPUs without File=, and File= must stat() as a device: /dev/null links do.
  for g in $(seq 0 $((NODE_GPUS - 1))); do ln -sfn /dev/null "$STATE/fakegpu/nvidia$g"; done
  local bind="CommunicationParameters=NoCtldInAddrAny,NoInAddrAny"
  # NoInAddrAny binds what `hostname` resolves to; if that is not loopback, bind 0.0.0.0.
  if [ "$(getent ahostsv4 "$(hostname)" | awk 'NR==1{print $1}')" != 127.0.0.1 ]; then
    echo "slurm-cluster: WARN $(hostname) does not resolve to 127.0.0.1; daemons bind 0.0.0.0" >&2
    bind="# $bind (hostname is not loopback)"
  fi
  cat > "$CONF" <<EOF
ClusterName=allot
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
$bind
AuthType=auth/munge
CredType=cred/munge
# A requeued job may start again cred_expire seconds after it ended (default 120).
AuthInfo=cred_expire=10
# A test cluster: the controller runs as root, so the state dir needs no chown.
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups or systemd in CI containers.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
SchedulerType=sched/backfill
# Re-evaluate pending (e.g. requeued) jobs every 5 s instead of 60/30 s.
SchedulerParameters=sched_interval=5,bf_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
# Node CPUs and memory are declared, not detected (the host has fewer).
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
# A cancel (allot's Terminate) is SIGTERM, then SIGKILL this long after. The backend contract's
# "ignores Terminate" rule watches ~2.5 s for the run to keep running: keep this above that.
KillWait=5
# Finished jobs stay in squeue this long: the backend reads their exit codes there.
MinJobAge=300
SlurmdTimeout=30
InactiveLimit=0
MaxJobCount=20000
# Accounting in slurmdbd (MariaDB), with each job's GPUs: sacct -o AllocTRES shows gres/gpu.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/log/jobcomp.log
# allot's submit-time gate (job_submit.lua beside this file), here for partition "gated" only:
# the tests of other partitions submit jobs that must run without allot.
JobSubmitPlugins=lua
EOF
  for n in $(seq 1 "$NODES"); do
    echo "NodeName=node$n NodeHostname=node$n NodeAddr=127.0.0.1 Port=$((NODE_PORT_BASE + n)) CPUs=$NODE_CPUS RealMemory=4000 Gres=gpu:$GPU_TYPE:$NODE_GPUS State=UNKNOWN" >> "$CONF"
  done
  cat >> "$CONF" <<EOF
PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP
# For tests of a partition allot leaves unmanaged.
PartitionName=unmanaged Nodes=node$NODES Default=NO MaxTime=INFINITE State=UP
# For tests of the submit-time gate: every job submitted here is held by job_submit.lua.
PartitionName=gated Nodes=node$NODES Default=NO MaxTime=INFINITE State=UP
EOF
  sed 's/^local MANAGED = {}$/local MANAGED = { gated = true }/' "$GATE_SCRIPT" > "$STATE/etc/job_submit.lua"
  grep -q '^local MANAGED = { gated = true }$' "$STATE/etc/job_submit.lua"
  cat > "$STATE/etc/gres.conf" <<EOF
NodeName=node[1-$NODES] Name=gpu Type=$GPU_TYPE File=$STATE/fakegpu/nvidia[0-$((NODE_GPUS - 1))]
EOF
  # slurmdbd reads slurmdbd.conf beside slurm.conf; it must be private to SlurmUser.
  install -m 0600 /dev/null "$STATE/etc/slurmdbd.conf"
  cat > "$STATE/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$STATE/run/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=allot-test
StorageLoc=slurm_acct_db
EOF
  # slurmd loads a cgroup plugin at start even with proctrack/linuxproc and task/none.
  printf 'CgroupPlugin=autodetect\nIgnoreSystemd=yes\n' > "$STATE/etc/cgroup.conf"
}

# MariaDB for slurmdbd, fresh each time (the controller starts fresh too, so job ids repeat).
start_mariadb() {
  rm -rf "$STATE/mariadb"
  install -d -m 0700 "$STATE/mariadb"
  mariadb-install-db --no-defaults --user=root --datadir="$STATE/mariadb" --skip-test-db \
    --auth-root-authentication-method=socket > "$STATE/log/mariadb-install.log" 2>&1
  mariadbd --no-defaults --user=root --datadir="$STATE/mariadb" --bind-address=127.0.0.1 \
    --port="$DB_PORT" --socket="$STATE/run/mariadb.sock" --pid-file="$STATE/run/mariadb.pid" \
    --log-error="$STATE/log/mariadb.log" --innodb-buffer-pool-size=64M --skip-name-resolve \
    < /dev/null > /dev/null 2>&1 &
  local sql=(mariadb --no-defaults --socket="$STATE/run/mariadb.sock" -uroot)
  for _ in $(seq 1 120); do "${sql[@]}" -e 'select 1' >/dev/null 2>&1 && break; sleep 0.25; done
  "${sql[@]}" -e "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'allot-test';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" || {
    echo "slurm-cluster: MariaDB did not start; see $STATE/log/mariadb.log" >&2
    exit 1
  }
}

start_slurmdbd() {
  slurmdbd
  for _ in $(seq 1 120); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.25; done
  sacctmgr -n list cluster >/dev/null || {
    echo "slurm-cluster: slurmdbd did not answer; see $STATE/log/slurmdbd.log" >&2
    exit 1
  }
  sacctmgr -i add cluster allot >/dev/null
  sacctmgr -i add account "$ACCOUNTS" cluster=allot >/dev/null
  sacctmgr -i add user root,allot-user account="$ACCOUNTS" cluster=allot >/dev/null
}

up() {
  local t0; t0=$(date +%s.%N)
  install_packages
  if [ "$(id -u)" -ne 0 ]; then
    echo "slurm-cluster: the daemons need root (slurmd runs jobs as their users); run it as root" >&2
    exit 1
  fi
  install -d -m 0755 "$STATE/run"
  if [ -s "$STATE/run/slurmctld.pid" ] && kill -0 "$(cat "$STATE/run/slurmctld.pid")" 2>/dev/null; then
    echo "slurm-cluster: already running (run '$0 down' first)" >&2
    exit 1
  fi
  write_configs
  # An unprivileged user for the tests of jobs run as the workload's user (sbatch --uid).
  id allot-user > /dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin allot-user
  start_munge
  export SLURM_CONF=$CONF
  start_mariadb
  start_slurmdbd
  # -c: a fresh controller, without the jobs of an earlier run.
  slurmctld -c -f "$CONF"
  for n in $(seq 1 "$NODES"); do slurmd -f "$CONF" -N "node$n"; done
  for _ in $(seq 1 240); do
    [ "$(sinfo -h -N -p batch -t idle -o %N 2>/dev/null | sort -u | wc -l)" = "$NODES" ] && break
    sleep 0.25
  done
  if [ "$(sinfo -h -N -p batch -t idle -o %N 2>/dev/null | sort -u | wc -l)" != "$NODES" ]; then
    echo "slurm-cluster: nodes not idle after 60 s; see $STATE/log/" >&2
    sinfo -N -o '%N %P %T %G %E' >&2 || true
    exit 1
  fi
  echo "slurm-cluster: up in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s; export SLURM_CONF=$CONF"
  sinfo -N -o '%N %P %T %G'
}

# The controller alone, for tests of a slurmctld restart: stopped, then started again from its
# saved state (no -c: the jobs it had are kept, as after a real controller restart).
ctld_stop() { stop_pidfile "$STATE/run/slurmctld.pid"; echo "slurm-cluster: slurmctld stopped"; }
ctld_start() {
  export SLURM_CONF=$CONF
  slurmctld -f "$CONF"
  for _ in $(seq 1 120); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.25; done
  echo "slurm-cluster: slurmctld started"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  ctld-stop) ctld_stop ;;
  ctld-start) ctld_start ;;
  *) echo "usage: $0 up|down|env|ctld-stop|ctld-start  (state in \$ALLOT_SLURM_DIR, default /tmp/allot-slurm)" >&2; exit 2 ;;
esac
