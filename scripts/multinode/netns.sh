#!/usr/bin/env bash
# Two "nodes" on one machine: two network namespaces joined by a veth pair (a virtual Ethernet cable).
#
#   sudo bash scripts/multinode/netns.sh up   [PREFIX]     # create  PREFIX-node0 (10.77.0.1) and PREFIX-node1 (10.77.0.2)
#   sudo bash scripts/multinode/netns.sh exec PREFIX N CMD...   # run CMD on node N: its network, its hostname (nodeN)
#   sudo bash scripts/multinode/netns.sh down [PREFIX]     # delete them again (safe to run twice)
#   sudo bash scripts/multinode/netns.sh check             # exit 0 if this machine lets us create namespaces
#   sudo bash scripts/multinode/netns.sh gc                # delete leftovers (ours, with no process left inside)
#
# Each namespace has its own network stack: only `lo` and one end of the cable, called veth0 in both (like
# eth0 on two real machines, so GLOO_SOCKET_IFNAME=veth0 / NCCL_SOCKET_IFNAME=veth0 is the same on every node).
# Traffic between the nodes goes through veth0, never through loopback. `exec` also gives the command a
# hostname of its own (node0, node1: a UTS namespace) and an /etc/hosts that names both nodes, so
# MASTER_ADDR=node0 resolves as it would on a cluster. Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN).
# Whoever calls `up` must call `down`: scripts/multinode/two_nodes.py does it in a `finally`, the tests in a fixture.
set -euo pipefail
SUBNET=${DN_SUBNET:-10.77.0}       # node0 is $SUBNET.1, node1 is $SUBNET.2 (/24)
IFNAME=veth0

ns() { echo "$1-node$2"; }

up() {
  local p=$1
  down "$p" 2>/dev/null || true  # leftovers of an earlier run with this prefix
  for i in 0 1; do
    ip netns add "$(ns "$p" $i)"
    ip -n "$(ns "$p" $i)" link set lo up
  done
  # the cable: created in the root namespace with unique names, each end then moved into its node and renamed
  ip link add "${p}a" type veth peer name "${p}b"
  ip link set "${p}a" netns "$(ns "$p" 0)"
  ip link set "${p}b" netns "$(ns "$p" 1)"
  ip -n "$(ns "$p" 0)" link set "${p}a" name $IFNAME
  ip -n "$(ns "$p" 1)" link set "${p}b" name $IFNAME
  for i in 0 1; do
    ip -n "$(ns "$p" $i)" addr add "$SUBNET.$((i + 1))/24" dev $IFNAME
    ip -n "$(ns "$p" $i)" link set $IFNAME up
    # `exec` below bind-mounts /etc/netns/NAME/hosts over /etc/hosts for the command it runs (as `ip netns exec` does)
    mkdir -p "/etc/netns/$(ns "$p" $i)"
    printf '127.0.0.1 localhost\n%s.1 node0\n%s.2 node1\n' "$SUBNET" "$SUBNET" > "/etc/netns/$(ns "$p" $i)/hosts"
    # and resolv.conf over /etc/resolv.conf: no DNS server is reachable from the namespace, so
    # name lookups must not wait for one (a reverse lookup that times out costs seconds each time)
    printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' > "/etc/netns/$(ns "$p" $i)/resolv.conf"
  done
  echo "netns: $(ns "$p" 0) ($SUBNET.1 on $IFNAME) <-veth-> $(ns "$p" 1) ($SUBNET.2 on $IFNAME)"
}

down() {
  local p=$1 i name
  for i in 0 1; do
    name=$(ns "$p" $i)
    if ip netns list | grep -qw "$name"; then
      ip netns pids "$name" 2>/dev/null | xargs -r kill -9 2>/dev/null || true  # nothing may outlive its node
      ip netns delete "$name"  # deleting a namespace deletes the veth end inside it, and with it the pair
    fi
    rm -rf "/etc/netns/$name"
  done
  ip link delete "${p}a" 2>/dev/null || true  # only if `up` failed halfway, before the move
}

run_on() {  # run_on PREFIX N CMD...: CMD on node N: its network, its host name (nodeN), its /etc/hosts
  local p=$1 i=$2; shift 2
  # nsenter --net rather than `ip netns exec`, which also remounts /sys and so hides the cgroup mounts (slurmd needs them)
  exec nsenter --net="/run/netns/$(ns "$p" "$i")" unshare --mount --uts sh -c '
    mount --bind "/etc/netns/$0/hosts" /etc/hosts && mount --bind "/etc/netns/$0/resolv.conf" /etc/resolv.conf &&
    hostname "$1" && shift && exec "$@"' "$(ns "$p" "$i")" "node$i" "$@"
}

case "${1:-}" in
  up)    up "${2:-dn}" ;;
  down)  down "${2:-dn}" ;;
  exec)  [ $# -ge 4 ] || { echo "usage: netns.sh exec PREFIX NODE CMD..." >&2; exit 2; }; run_on "$2" "$3" "${@:4}" ;;
  check) p="dnchk$$"; ip netns add "$p-node0" 2>/dev/null && ip netns delete "$p-node0" ;;
  gc)    for name in $(ip netns list | awk '{print $1}' | grep -E '^dn[a-z0-9]*-node[01]$' || true); do
           [ -z "$(ip netns pids "$name" 2>/dev/null)" ] && ip netns delete "$name" && rm -rf "/etc/netns/$name" && echo "netns: removed leftover $name"
         done; true ;;
  *)     sed -n '2,16p' "$0" >&2; exit 2 ;;
esac
