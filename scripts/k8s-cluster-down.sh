#!/bin/bash
# Stop what scripts/k8s-cluster-up.sh started, by the PIDs it recorded, and remove its state
# (the PKI is kept for the next run). Safe to run twice, or after a failed start.
#
# Pods first (so the kubelet runs CNI DEL and unmounts), then the node, control plane,
# containerd's leftover tasks and containerd, etcd; then the mounts, network namespaces and
# cgroups the kubelet and containerd made. Run it in the namespaces the cluster ran in.
WORK=${WORK:-/tmp/orchard-k8s}
PORT=${PORT:-16443}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$WORK" 2>/dev/null || exit 0
log() { echo "k8s-cluster-down: $*"; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
api() { curl -sf --max-time 10 --cacert pki/ca.crt --cert pki/admin.crt --key pki/admin.key "$@"; }
CTR=(ctr --address "$WORK/containerd/containerd.sock" -n k8s.io)
stop() {  # stop the process in pidfile $1: TERM, then KILL after $2 tenths of a second
  alive "$1" || return 0
  local pid; pid=$(cat "$1"); kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 "$2"); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  log "$1: $pid did not stop on SIGTERM; SIGKILL"; kill -KILL "$pid" 2>/dev/null; sleep 0.2
}

if alive node.pid && alive apiserver.pid && [ -S containerd/containerd.sock ]; then
  # delete every pod (grace 0), then give the kubelet up to 60 s to stop every sandbox
  for ns in $(api "https://127.0.0.1:$PORT/api/v1/namespaces" | grep -o '"name":"[^"]*"' | cut -d'"' -f4 | sort -u); do
    api -X DELETE "https://127.0.0.1:$PORT/api/v1/namespaces/$ns/pods?gracePeriodSeconds=0" >/dev/null 2>&1
  done
  for _ in $(seq 1 600); do [ -z "$("${CTR[@]}" tasks ls -q 2>/dev/null)" ] && break; sleep 0.1; done
fi
# pod network namespaces our containerd still holds, to remove after a hard stop
NETNS=""
if [ -S containerd/containerd.sock ]; then
  for id in $("${CTR[@]}" containers ls -q 2>/dev/null); do
    NETNS="$NETNS $("${CTR[@]}" containers info "$id" 2>/dev/null | grep -o '/var/run/netns/cni-[0-9a-f-]*' | head -1)"
  done
fi
# hollow nodes (scripts/k8s-hollow-nodes.sh) by their recorded PIDs, while the API server still
# answers their Node deletes
[ -d hollow ] && ORCHARD_K8S_WORK="$WORK" PORT="$PORT" HOLLOW_PREFIX="" bash "$here/k8s-hollow-nodes.sh" stop
stop node.pid 100
for c in sched kcm apiserver; do stop $c.pid 100; done
if alive containerd.pid; then
  for id in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks kill -s SIGKILL "$id" >/dev/null 2>&1; done
  sleep 1
  for id in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks rm -f "$id" >/dev/null 2>&1; done
  for id in $("${CTR[@]}" containers ls -q 2>/dev/null); do "${CTR[@]}" containers rm "$id" >/dev/null 2>&1; done
  stop containerd.pid 100
fi
stop etcd.pid 100
# what ctr could not stop: shims of this containerd (by its socket on their command line) and,
# when the kubelet's cgroups are ours, any process still in them (a pod's)
for p in /proc/[0-9]*; do
  pid=${p#/proc/}
  cmd=$(tr '\0' ' ' 2>/dev/null < "$p/cmdline") || continue
  if [[ "$cmd" == *containerd-shim*"$WORK/containerd/containerd.sock"* ]] ||
     { [ -f cgroups.ours ] && grep -q ':/kubepods' "$p/cgroup" 2>/dev/null; }; then
    log "leftover $pid ($(echo "$cmd" | cut -c1-80)): SIGKILL"; kill -KILL "$pid" 2>/dev/null
  fi
done
# kubelet and containerd leave mounts (volumes, overlay roots, netns bind mounts) behind
grep -o " $WORK/[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
ip link del k8slocal0 2>/dev/null
for n in $NETNS; do ip netns del "$(basename "$n")" 2>/dev/null; done
# the kubelet's pod cgroups (cgroupfs driver), empty once every container is gone: deepest first
if [ -f cgroups.ours ]; then
  for hier in /sys/fs/cgroup/*/ /sys/fs/cgroup/unified/ /sys/fs/cgroup/; do
    [ -d "${hier}kubepods" ] && find "${hier}kubepods" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  rm -f cgroups.ours
fi
rm -rf "$WORK/etcd-data" "$WORK/kubelet" "$WORK/kubelet-pki" "$WORK/containerd/root" "$WORK/containerd/state" \
  "$WORK/cni/ipam" "$WORK"/*.pid "$WORK/hollow"
log "stopped"
exit 0
