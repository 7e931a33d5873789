#!/bin/bash
# A real one-node Kubernetes (v1.20.2 built from Debian's source package; kubelet + containerd)
# for orchard-async's kubernetes tests, on this machine, with no registry and no internet.
#
#   bash scripts/ci-kubernetes.sh prepare        packages, binaries, images (idempotent)
#   bash scripts/ci-kubernetes.sh run -- CMD...  prepare, then run CMD inside private network
#                                                and mount namespaces with the cluster up;
#                                                exits with CMD's exit code
#   bash scripts/ci-kubernetes.sh                run -- python -m pytest on the kubernetes tests
#
# Inside `run`, CMD sees KUBECONFIG (context "local", admin), ORCHARD_K8S_WORK (the cluster's
# state dir), ORCHARD_K8S_SCRIPTS (this folder: tests restart the API server with
# `k8s-cluster-up.sh apiserver-stop|apiserver-start`), ORCHARD_K8S_IMAGE (the adapter's
# default image: orchard/python:test when Docker had it to give, else local/busybox:1) and
# ORCHARD_HOST_NS_PID (a process in the host's namespaces: docker-up.sh starts dockerd there)
# and ORCHARD_K8S_POD_MAX_PIDS (the kubelet's per-pod pids limit, $POD_MAX_PIDS, default 1024)
# and CONTAINERD_ADDRESS (the node's containerd socket: snapshots import into it).
# The images Docker has of $PY_IMAGE and $ORCHARD_K8S_EXTRA_IMAGES (default: the SWE recipe's
# orchard/swe-python:bookworm, what `orchard-async demo --adapter kubernetes` runs, and the
# adapter's egress filter, orchard/egress:bookworm: with it on the node every sandbox pod holds
# its network with iptables whatever the CNI) are loaded into the node's containerd.
# The namespaces have no route to the outside (a veth pair whose both ends stay inside):
# install Python packages before `run`.
# The docker daemon's unix socket works from inside, so a whole test suite can run there.
#
# Nothing outlives `run`: the cluster is stopped by the PIDs it recorded
# (k8s-cluster-down.sh, which also kills what is left of the pods), then any process still
# in the private network namespace is killed by PID. The mounts die with the mount
# namespace (tmpfs over /run/netns, /var/lib/cni, /var/log/pods, /var/log/containers,
# /run/containerd, so nothing lands in the host's copies), the bridge, veths and iptables
# rules with the network namespace; k8s-cluster-down.sh removes the kubelet's empty pod
# cgroups. Not a PID namespace: tests must see the host's processes (a Docker daemon they
# restart by its PID).
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
PY_IMAGE=${ORCHARD_K8S_PYTHON_IMAGE:-orchard/python:test}
EXTRA_IMAGES=${ORCHARD_K8S_EXTRA_IMAGES:-orchard/swe-python:bookworm orchard/egress:bookworm}
export POD_MAX_PIDS=${POD_MAX_PIDS:-1024}  # the kubelet's podPidsLimit (k8s-cluster-up.sh)
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
  python_image
}

# The SWE recipe (what `orchard-async demo` runs) needs python3 and git in the sandbox: the
# images of $PY_IMAGE and $EXTRA_IMAGES that a Docker daemon has (`orchard-async images build
# --test` builds them) are saved for the cluster in one tarball (they share their layers;
# re-saved only when one changed). Without them the cluster has busybox only.
python_image() {
  local id img present=() ids=""
  rm -f "$IMAGES_DIR/python.ref"
  if command -v docker >/dev/null; then
    for img in $PY_IMAGE $EXTRA_IMAGES; do
      if id=$(timeout 20 docker image inspect -f '{{.Id}}' "$img" 2>/dev/null); then
        present+=("$img"); ids="$ids $img=$id"
      fi
    done
  fi
  if [ ${#present[@]} = 0 ]; then
    rm -f "$IMAGES_DIR/python.tar" "$IMAGES_DIR/python.id"
    log "no Docker image of $PY_IMAGE $EXTRA_IMAGES to reuse: the cluster gets busybox only (the swe demo needs python3 + git)"
    return 0
  fi
  if [ "$(cat "$IMAGES_DIR/python.id" 2>/dev/null)" != "$ids" ] || [ ! -s "$IMAGES_DIR/python.tar" ]; then
    local t; t=$(now)
    timeout 600 docker save "${present[@]}" -o "$IMAGES_DIR/python.tar.tmp" || { rm -f "$IMAGES_DIR/python.tar.tmp"; die "docker save ${present[*]} failed"; }
    mv "$IMAGES_DIR/python.tar.tmp" "$IMAGES_DIR/python.tar"
    echo "$ids" > "$IMAGES_DIR/python.id"
    log "saved ${present[*]} for the cluster in $(since "$t") s"
  fi
  case " ${present[*]} " in *" $PY_IMAGE "*) echo "$PY_IMAGE" > "$IMAGES_DIR/python.ref" ;; esac
  log "images: $IMAGES_DIR/python.tar (${present[*]}; the default sandbox image inside \`run\`: $(cat "$IMAGES_DIR/python.ref" 2>/dev/null || echo local/busybox:1))"
}

# Processes still running in this network namespace once the cluster is down (a component
# that ignored SIGTERM, a command's stray child), killed by PID. Everything in this network
# namespace was started by this run; pod processes live in their own network namespaces and
# are handled by k8s-cluster-down.sh.
kill_leftovers() {
  local me p ns
  me=$(readlink /proc/$$/ns/net)
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [ "$p" = "$$" ] || [ "$p" = "$PPID" ] && continue  # this shell, and unshare (also in here)
    ns=$(readlink "/proc/$p/ns/net" 2>/dev/null) || continue
    if [ "$ns" = "$me" ]; then
      log "leftover process $p in the cluster's network namespace: $(tr '\0' ' ' 2>/dev/null < "/proc/$p/cmdline" | cut -c1-100); SIGKILL"
      kill -KILL "$p" 2>/dev/null
    fi
  done
}

# Runs in the new network and mount namespaces (unshare's child).
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
  local t rc=0 cmd=""
  # a signal (unshare passes SIGTERM on when it is killed; Ctrl-C): stop the command, then
  # the cluster, then whatever is left
  trap '[ -n "$cmd" ] && kill -TERM "$cmd" 2>/dev/null; bash "$here/k8s-cluster-down.sh"; kill_leftovers; exit 143' TERM INT HUP
  t=$(now)
  local images="$IMAGES_DIR/pause.tar $IMAGES_DIR/busybox.tar" default_image=""
  [ -s "$IMAGES_DIR/python.tar" ] && [ -s "$IMAGES_DIR/python.id" ] && images="$images $IMAGES_DIR/python.tar"
  [ -s "$IMAGES_DIR/python.ref" ] && default_image=$(cat "$IMAGES_DIR/python.ref")
  if ! MODE=real IMAGES="$images" bash "$here/k8s-cluster-up.sh"; then
    log "the cluster did not start; logs in $WORK"
    for f in apiserver kcm sched containerd node; do [ -f "$WORK/$f.log" ] && { echo "---- $f.log"; tail -15 "$WORK/$f.log"; }; done
    bash "$here/k8s-cluster-down.sh" || true
    kill_leftovers
    return 3
  fi
  log "cluster up in $(since "$t") s; running: $*"
  # in the background (with this stdin) so that a signal's trap runs at once, not after it;
  # `trap -` undoes the SIGINT/SIGQUIT ignore bash gives background commands (tests send
  # Ctrl-C to the programs they start)
  exec 3<&0
  (
    trap - INT QUIT
    export KUBECONFIG="$WORK/kubeconfig" ORCHARD_K8S_WORK="$WORK" ORCHARD_K8S_SCRIPTS="$here"
    export ORCHARD_K8S_POD_MAX_PIDS="$POD_MAX_PIDS"
    # the node's containerd: kubernetes snapshots import into it (adapters/kubernetes/snapshot.py)
    export CONTAINERD_ADDRESS="$WORK/containerd/containerd.sock"
    export ORCHARD_K8S_IMAGE="${ORCHARD_K8S_IMAGE:-${default_image:-local/busybox:1}}"
    exec "$@"
  ) <&3 &
  cmd=$!
  wait "$cmd" || rc=$?
  cmd=""
  t=$(now)
  bash "$here/k8s-cluster-down.sh" || true
  kill_leftovers
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
  export ORCHARD_HOST_NS_PID=$$  # this shell stays outside: the host's namespaces for docker-up.sh
  # New network and mount namespaces, not a PID namespace: tests must see (and signal) the
  # host's processes, e.g. a Docker daemon they restart. Ctrl-C, or SIGTERM to the process
  # group, reaches the child, whose trap tears the cluster down; unshare itself ignores
  # SIGINT/SIGTERM while it waits, and if it is SIGKILLed, --kill-child sends the child
  # SIGTERM (checked: nothing is left running, mounted or in the cgroups afterwards).
  unshare --net --mount --propagation private --fork --kill-child=SIGTERM \
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
