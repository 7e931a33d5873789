#!/bin/bash
# A real one-node Kubernetes (v1.20.2 built from Debian's source package; kubelet + containerd)
# for orchard-async's kubernetes tests, on this machine, with no registry and no internet.
#
#   bash scripts/ci-kubernetes.sh prepare        packages, binaries, images (idempotent)
#   bash scripts/ci-kubernetes.sh run -- CMD...  prepare, then run CMD inside private network,
#                                                mount and PID namespaces with the cluster up;
#                                                exits with CMD's exit code
#   bash scripts/ci-kubernetes.sh                run -- python -m pytest on the kubernetes tests
#
# Inside `run`, CMD sees KUBECONFIG (context "local", admin), ORCHARD_K8S_WORK (the cluster's
# state dir) and ORCHARD_K8S_SCRIPTS (this folder: tests restart the API server with
# `k8s-cluster-up.sh apiserver-stop|apiserver-start`). The namespaces have no route to the
# outside (a veth pair whose both ends stay inside): install Python packages before `run`.
# The docker daemon's unix socket works from inside, so a whole test suite can run there.
#
# Nothing outlives `run`: the cluster is stopped by the PIDs it recorded
# (k8s-cluster-down.sh), and whatever it missed dies with the namespaces: every process
# with the PID namespace, the mounts (tmpfs over /run/netns, /var/lib/cni, /var/log/pods,
# /run/containerd, so nothing lands in the host's copies) with the mount namespace, the
# bridge, veths and iptables rules with the network namespace. The kubelet's empty pod
# cgroups are removed by k8s-cluster-down.sh.
#
# Steps and times on the 2-core reference machine: packages ~30 s (first time), binaries
# ~12-40 min (first time; cached in /var/cache/k8s-from-debian), images <1 s, cluster up
# 20-40 s, down ~5 s.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export K8S_CACHE=${K8S_CACHE:-/var/cache/k8s-from-debian}
export K8S_BIN=${K8S_BIN:-$K8S_CACHE/bin}
export WORK=${ORCHARD_K8S_WORK:-/tmp/orchard-k8s}
IMAGES_DIR=${ORCHARD_K8S_IMAGES:-/var/tmp/orchard-k8s-images}
export DEBIAN_FRONTEND=noninteractive
log() { echo "ci-kubernetes: $*"; }
die() { echo "ci-kubernetes: ERROR: $*" >&2; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }

prepare() {
  [ "$(id -u)" = 0 ] || die "must run as root (containerd, kubelet, namespaces)"
  local t missing=() p
  t=$(now)
  for p in containerd containernetworking-plugins etcd-server busybox-static openssl curl iproute2 util-linux; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" = "install ok installed" ] || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get update -qq >/tmp/orchard-k8s-apt.log 2>&1 || { tail -20 /tmp/orchard-k8s-apt.log >&2; die "apt-get update failed"; }
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >>/tmp/orchard-k8s-apt.log 2>&1 \
      || { tail -30 /tmp/orchard-k8s-apt.log >&2; die "apt-get install ${missing[*]} failed"; }
    log "packages installed in $(since "$t") s"
  fi
  t=$(now)
  bash "$here/k8s-build.sh"
  log "binaries ready in $(since "$t") s ($K8S_BIN)"
  python3 "$here/k8s-images.py" "$IMAGES_DIR" --pause "$K8S_BIN/pause" --busybox /bin/busybox >/dev/null
  log "images: $IMAGES_DIR/pause.tar (local/pause:3.2), $IMAGES_DIR/busybox.tar (local/busybox:1)"
}

# Runs as PID 1 of the new namespaces.
inner() {
  ip link set lo up
  # the kubelet refuses a loopback node IP: a veth pair (both ends here) carries the default
  # route; 192.0.2.0/24 is TEST-NET-1, and nothing leaves this namespace
  ip link add v0 type veth peer name v1
  ip addr add 192.0.2.10/24 dev v0
  ip link set v0 up; ip link set v1 up
  ip route add default dev v0
  local d
  for d in /run/netns /var/lib/cni /var/log/pods /var/log/containers /run/containerd; do
    mkdir -p "$d" && mount -t tmpfs -o mode=0755 orchard-k8s "$d"
  done
  bash "$here/k8s-cluster-down.sh" >/dev/null 2>&1 || true  # state a killed run left behind
  local t rc=0
  t=$(now)
  if ! MODE=real IMAGES="$IMAGES_DIR/pause.tar $IMAGES_DIR/busybox.tar" bash "$here/k8s-cluster-up.sh"; then
    log "the cluster did not start; logs in $WORK"
    for f in apiserver kcm sched containerd node; do [ -f "$WORK/$f.log" ] && { echo "---- $f.log"; tail -15 "$WORK/$f.log"; }; done
    bash "$here/k8s-cluster-down.sh" || true
    return 3
  fi
  log "cluster up in $(since "$t") s; running: $*"
  KUBECONFIG="$WORK/kubeconfig" ORCHARD_K8S_WORK="$WORK" ORCHARD_K8S_SCRIPTS="$here" "$@" || rc=$?
  t=$(now)
  bash "$here/k8s-cluster-down.sh" || true
  log "cluster down in $(since "$t") s; command exit code $rc"
  return "$rc"
}

run() {
  [ $# -gt 0 ] || die "usage: ci-kubernetes.sh run -- COMMAND [ARGS...]"
  prepare
  mkdir -p "$WORK"
  exec 8>"$WORK.lock"
  flock -w 600 8 || die "another ci-kubernetes.sh run holds $WORK.lock"
  local rc=0
  # --kill-child: if this script dies, the namespaces' init (and so everything in them) dies too
  unshare --net --mount --propagation private --pid --fork --kill-child --mount-proc \
    bash "$here/ci-kubernetes.sh" __inner "$@" || rc=$?
  return "$rc"
}

case "${1:-}" in
  prepare) prepare ;;
  run) shift; [ "${1:-}" = "--" ] && shift; run "$@" ;;
  __inner) shift; inner "$@" ;;
  "") run python -m pytest -q tests/conformance tests/adapters/test_kubernetes.py -k kubernetes ;;
  *) die "unknown command $1 (prepare, run -- CMD...)" ;;
esac
