#!/usr/bin/env bash
# A real Slurm cluster on this one machine (root): munge, slurmctld and slurmd, nothing faked.
#
#   bash scripts/slurm/local_cluster.sh install        # apt-get install slurmctld slurmd slurm-client munge (if missing)
#   bash scripts/slurm/local_cluster.sh start          # munge key, slurm.conf, munged, slurmctld, slurmd(s); waits for idle nodes
#   bash scripts/slurm/local_cluster.sh run CMD...     # run a Slurm command against it: run sbatch scripts/slurm/train_ddp.sbatch
#   bash scripts/slurm/local_cluster.sh status         # sinfo + squeue
#   bash scripts/slurm/local_cluster.sh stop           # stop every daemon, delete the namespaces; safe to run twice
#
# Two nodes when network namespaces work (scripts/multinode/netns.sh): node0 (10.77.0.1) runs slurmctld and a slurmd,
# node1 (10.77.0.2) a second slurmd; jobs started on a node run in its namespace, with its host name, so srun's tasks
# really sit on two hosts that talk over veth0. Otherwise (or with SLURM_LOCAL_NODES=1) one node on this host.
# Each node gets an equal share of this machine's CPUs. Everything lives in SLURM_LOCAL_DIR
# (default /tmp/distrinews-slurm): slurm.conf, the munge key and socket, state, logs, pids. Nothing in /etc/slurm
# is touched: Slurm commands find the cluster through SLURM_CONF, which `run` sets.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
NETNS="$HERE/../multinode/netns.sh"
DIR=${SLURM_LOCAL_DIR:-/tmp/distrinews-slurm}
PREFIX=${SLURM_LOCAL_PREFIX:-dnslurm}   # the namespaces: PREFIX-node0, PREFIX-node1
PKGS="slurmctld slurmd slurm-client munge"

say() { echo "[slurm] $*"; }
die() { echo "[slurm] $*" >&2; exit "${2:-1}"; }

nodes() { cat "$DIR/nodes" 2>/dev/null || echo 1; }

# run a command where the cluster's clients must run (node0's namespace when there are two nodes)
on_head() {
  if [ "$(nodes)" = 2 ]; then bash "$NETNS" exec "$PREFIX" 0 env SLURM_CONF="$DIR/slurm.conf" "$@"
  else env SLURM_CONF="$DIR/slurm.conf" "$@"; fi
}

install() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null && command -v munged >/dev/null; then
    say "already installed: $(slurmctld -V)"; return 0
  fi
  [ "$(id -u)" = 0 ] || die "installing Slurm needs root (apt-get)" 3
  command -v apt-get >/dev/null || die "no apt-get on this machine: install $PKGS with its package manager" 3
  local t0=$SECONDS
  say "installing $PKGS (apt-get, --no-install-recommends)"
  export DEBIAN_FRONTEND=noninteractive
  timeout 300 apt-get update -qq || die "apt-get update failed (no network to the package mirror?)" 3
  timeout 300 apt-get install -y -qq --no-install-recommends $PKGS >/dev/null || die "apt-get install $PKGS failed" 3
  say "installed $(slurmctld -V) in $((SECONDS - t0)) s"
}

start() {
  [ "$(id -u)" = 0 ] || die "the local cluster runs its daemons as root" 3
  for c in slurmctld slurmd sbatch munged; do command -v $c >/dev/null || die "$c is missing: run '$0 install' first" 3; done
  stop >/dev/null 2>&1 || true
  mkdir -p "$DIR"/{munge,ctld,log} "$DIR"/spool/{node0,node1,"$(hostname)"}
  chmod 700 "$DIR/munge"
  local n=${SLURM_LOCAL_NODES:-2}
  if [ "$n" = 2 ] && ! bash "$NETNS" check 2>/dev/null; then
    say "network namespaces are not available: one node on this host instead of two"; n=1
  fi
  echo "$n" > "$DIR/nodes"
  local cpus; cpus=$(nproc); local per=$(( cpus / n )); [ "$per" -ge 1 ] || per=1

  # 1. munge: every Slurm message is signed with a key all nodes share (here: one machine, one munged)
  dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1 count=1024 status=none
  chmod 400 "$DIR/munge/munge.key"
  munged --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" --pid-file="$DIR/munge/munged.pid" \
         --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" --force
  # 2. slurm.conf: the controller, the nodes with their CPUs, one partition
  local head_host head_addr
  if [ "$n" = 2 ]; then
    bash "$NETNS" up "$PREFIX" >/dev/null
    head_host=node0; head_addr=10.77.0.1
  else
    head_host=$(hostname); head_addr=127.0.0.1
  fi
  cat > "$DIR/slurm.conf" <<EOF
# written by scripts/slurm/local_cluster.sh: a $n-node cluster on one machine ($cpus CPUs, $per per node)
ClusterName=distrinews
SlurmctldHost=$head_host($head_addr)
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.%n.log
# no cgroups in a container: track processes through /proc, bind nothing
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobRequeue=1
SlurmdTimeout=60
MinJobAge=600
KillWait=5
EOF
  if [ "$n" = 2 ]; then
    echo "NodeName=node0 NodeAddr=10.77.0.1 CPUs=$per State=UNKNOWN" >> "$DIR/slurm.conf"
    echo "NodeName=node1 NodeAddr=10.77.0.2 CPUs=$per State=UNKNOWN" >> "$DIR/slurm.conf"
  else
    echo "NodeName=$head_host NodeAddr=127.0.0.1 CPUs=$per State=UNKNOWN" >> "$DIR/slurm.conf"
  fi
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >> "$DIR/slurm.conf"

  # 3. the daemons, in the foreground of a background shell each, so their pids are ours to stop
  : > "$DIR/pids"
  if [ "$n" = 2 ]; then
    bash "$NETNS" exec "$PREFIX" 0 slurmctld -D -i -f "$DIR/slurm.conf" >"$DIR/log/slurmctld.out" 2>&1 &
    echo $! >> "$DIR/pids"
    for i in 0 1; do
      bash "$NETNS" exec "$PREFIX" $i slurmd -D -N node$i -f "$DIR/slurm.conf" >"$DIR/log/slurmd.node$i.out" 2>&1 &
      echo $! >> "$DIR/pids"
    done
  else
    SLURM_CONF="$DIR/slurm.conf" slurmctld -D -i -f "$DIR/slurm.conf" >"$DIR/log/slurmctld.out" 2>&1 &
    echo $! >> "$DIR/pids"
    SLURM_CONF="$DIR/slurm.conf" slurmd -D -N "$head_host" -f "$DIR/slurm.conf" >"$DIR/log/slurmd.out" 2>&1 &
    echo $! >> "$DIR/pids"
  fi
  # 4. wait (bounded) until every node is idle
  local t
  for t in $(seq 1 60); do
    if [ "$(on_head sinfo -h -o '%t' 2>/dev/null | grep -c '^idle')" -ge 1 ] && \
       ! on_head sinfo -h -o '%t' 2>/dev/null | grep -qvE '^idle$'; then
      say "cluster up: $n node(s), $per CPU(s) each; SLURM_CONF=$DIR/slurm.conf"
      on_head sinfo
      return 0
    fi
    for pid in $(cat "$DIR/pids"); do kill -0 "$pid" 2>/dev/null || { tail -n 5 "$DIR"/log/*.out >&2 || true; stop; die "a Slurm daemon died at start (logs above, and in $DIR/log)"; }; done
    sleep 1
  done
  on_head sinfo >&2 || true
  stop
  die "the nodes did not become idle within 60 s (logs in $DIR/log)"
}

stop() {
  local pid
  if [ -f "$DIR/pids" ]; then
    for pid in $(cat "$DIR/pids"); do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 1 20); do
      alive=0; for pid in $(cat "$DIR/pids"); do kill -0 "$pid" 2>/dev/null && alive=1; done
      [ $alive = 0 ] && break; sleep 0.5
    done
    for pid in $(cat "$DIR/pids"); do kill -KILL "$pid" 2>/dev/null || true; done
    rm -f "$DIR/pids"
  fi
  # slurmstepd processes of jobs still running, then munged
  for pid in $(pgrep -f "slurmstepd.*" 2>/dev/null || true); do
    tr '\0' ' ' < "/proc/$pid/environ" 2>/dev/null | grep -q "SLURM_CONF=$DIR/slurm.conf" && kill -KILL "$pid" 2>/dev/null || true
  done
  if [ -f "$DIR/munge/munged.pid" ]; then
    kill -TERM "$(cat "$DIR/munge/munged.pid")" 2>/dev/null || true
    rm -f "$DIR/munge/munged.pid"
  fi
  bash "$NETNS" down "$PREFIX" 2>/dev/null || true  # also kills anything still inside the namespaces
  say "stopped"
}

case "${1:-}" in
  install) install ;;
  start)   start ;;
  stop)    stop ;;
  run)     shift; [ $# -ge 1 ] || die "usage: $0 run CMD..." 2; on_head "$@" ;;
  status)  on_head sinfo; on_head squeue ;;
  *)       sed -n '2,17p' "$0" >&2; exit 2 ;;
esac
