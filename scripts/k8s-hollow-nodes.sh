#!/bin/bash
# kubemark hollow nodes for scale tests: N `kubemark --morph=kubelet` processes that register
# with the test cluster's API server as nodes and take pods that reach Running with no
# process behind them (a fake container runtime). What they measure is the control plane:
# API server, scheduler, the kubelets' status updates and the controller's watch; nothing
# can be exec'd in their pods.
#
#   k8s-hollow-nodes.sh start N [MAX_PODS]   start N hollow nodes, wait until every one is Ready
#   k8s-hollow-nodes.sh stop                 stop them by their recorded PIDs, delete their Node objects
#   k8s-hollow-nodes.sh status               one line per hollow node: name, PID, RSS
#
# HOLLOW_PREFIX (default hollow-) names the nodes PREFIX1..PREFIXN, and stop/status act on that
# prefix only; HOLLOW_BASE_PORT (default 21000) + index is each node's kubelet port: two sets
# of nodes at once (a test beside a bench) need different prefixes and base ports.
#
# Run inside `scripts/ci-kubernetes.sh run -- CMD` (its namespaces; ORCHARD_K8S_WORK is the
# cluster's state dir, default /tmp/orchard-k8s). k8s-cluster-down.sh stops what is left.
#
# Every hollow node is labelled `orchard.hollow=true` and tainted `orchard.hollow=true:NoSchedule`
# so that nothing but pods that ask for it (the kubernetes adapter's `control_plane_only`
# option adds the toleration and the node selector) lands on a node with no runtime.
#
# MAX_PODS: pods per node. kubemark v1.20 hard-codes its kubelet's maxPods (110) and has no
# flag for it, so MAX_PODS (default 110) is checked against what the node reports and the
# start fails if they differ; for more pods, start more nodes: ceil(sandboxes / 110).
#
# More than ~8 nodes need fs.inotify.max_user_instances above the default 128: the script
# says so, and raises it to 1000 (host-wide, as kubemark's manifests do) with HOLLOW_RAISE_INOTIFY=1.
#
# Cost on the 2-core reference machine: 74 MB RSS per hollow node once Ready (printed at start;
# `status` prints each), 88 MB (max 90) with ~109 pods each (46 nodes, 5,000 pods: 4.4 GB in all);
# 46 nodes started together were Ready in 53-65 s; a few status updates per node every 10 s to
# the API server, and their pod sync is most of a large run's CPU (46 nodes and 5,000 pods: 653 s
# of CPU in a 15-minute run). HOLLOW_MB_PER_NODE (default 120) x N must be below MemAvailable.
set -euo pipefail
WORK=${ORCHARD_K8S_WORK:-${WORK:-/tmp/orchard-k8s}}
K8S_BIN=${K8S_BIN:-/var/cache/k8s-from-debian/bin}
PORT=${PORT:-16443}
DIR="$WORK/hollow"
PREFIX=${HOLLOW_PREFIX-hollow-}  # node names; stop and status act on this prefix ("" = all)
BASE_PORT=${HOLLOW_BASE_PORT:-21000}  # each node's kubelet port: BASE_PORT + index
KUBEMARK_MAX_PODS=110
INOTIFY_PER_NODE=12  # inotify instances one hollow kubelet holds (10 nodes exhausted the default 128)
MB_PER_NODE=${HOLLOW_MB_PER_NODE:-120}  # memory to have free per node: ~75 MB measured once Ready, more with 110 pods
log() { echo "k8s-hollow-nodes: $*"; }
die() { echo "k8s-hollow-nodes: ERROR: $*" >&2; exit 1; }
api() { curl -sf --max-time 10 --cacert "$WORK/pki/ca.crt" --cert "$WORK/pki/admin.crt" --key "$WORK/pki/admin.key" "$@"; }
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

start() {
  local count=${1:-}; local max_pods=${2:-$KUBEMARK_MAX_PODS}
  [[ "$count" =~ ^[1-9][0-9]*$ ]] || die "usage: k8s-hollow-nodes.sh start N [MAX_PODS]"
  [ "$max_pods" = "$KUBEMARK_MAX_PODS" ] \
    || die "kubemark v1.20 fixes max-pods at $KUBEMARK_MAX_PODS per node; start ceil(pods / $KUBEMARK_MAX_PODS) nodes instead"
  [ -x "$K8S_BIN/kubemark" ] || die "no kubemark in $K8S_BIN (scripts/k8s-build.sh builds it)"
  [ -f "$WORK/kubeconfig" ] || die "no cluster in $WORK: run inside scripts/ci-kubernetes.sh run -- CMD"
  # every kubelet (hollow or not) takes several inotify instances; the default limit of 128 per
  # user stops the 16th hollow node here. kubemark's own deployment raises it to 1000.
  local limit running
  limit=$(cat /proc/sys/fs/inotify/max_user_instances)
  running=$(ls "$DIR"/*.pid 2>/dev/null | wc -l || true)
  if [ $(((running + count) * INOTIFY_PER_NODE + 32)) -gt "$limit" ]; then
    [ "${HOLLOW_RAISE_INOTIFY:-}" = 1 ] \
      || die "$((running + count)) hollow nodes need fs.inotify.max_user_instances >= $(((running + count) * INOTIFY_PER_NODE + 32)) (it is $limit): set HOLLOW_RAISE_INOTIFY=1 to raise it to 1000 (host-wide), or start fewer"
    sysctl -qw fs.inotify.max_user_instances=1000
    log "fs.inotify.max_user_instances: $limit -> 1000 (host-wide)"
  fi
  # a machine shared with others: refuse rather than push it into swap or the OOM killer
  local available_mb
  available_mb=$(awk '/^MemAvailable/ {print int($2 / 1024)}' /proc/meminfo)
  [ $((count * MB_PER_NODE)) -lt "$available_mb" ] \
    || die "$count hollow nodes need ~$((count * MB_PER_NODE)) MB (HOLLOW_MB_PER_NODE=$MB_PER_NODE each) and $available_mb MB is available: start fewer"
  mkdir -p "$DIR"
  local i name first=1 t0
  t0=$(date +%s.%N)
  while [ -f "$DIR/$PREFIX$first.pid" ]; do first=$((first + 1)); done  # add to those already running
  # Every hollow kubelet serves its fake runtime at the fixed path /tmp/kubelet_remote.sock:
  # each gets a private /tmp (its own mount namespace; unshare execs, so $! is kubemark's PID)
  # and reads a kubeconfig with the certificates inline through fd 3, opened before /tmp is hidden.
  local kc="$DIR/kubeconfig.inline"
  cat > "$kc" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://127.0.0.1:$PORT", certificate-authority-data: $(base64 -w0 "$WORK/pki/ca.crt")}
users:
- name: admin
  user: {client-certificate-data: $(base64 -w0 "$WORK/pki/admin.crt"), client-key-data: $(base64 -w0 "$WORK/pki/admin.key")}
contexts:
- name: local
  context: {cluster: local, user: admin}
current-context: local
EOF
  for i in $(seq "$first" $((first + count - 1))); do
    name="$PREFIX$i"
    # healthz off and the read-only port off: many hollow kubelets share one network namespace
    unshare --mount --propagation private bash -c 'mount -t tmpfs -o mode=1777 hollow-tmp /tmp && exec "$@"' hollow \
    "$K8S_BIN/kubemark" --morph=kubelet --name="$name" --kubeconfig=/proc/self/fd/3 3<"$kc" \
      --kubelet-port=$((BASE_PORT + i)) --kubelet-read-only-port=0 \
      --node-labels=orchard.hollow=true --register-with-taints=orchard.hollow=true:NoSchedule \
      > "$DIR/$name.log" 2>&1 &
    echo $! > "$DIR/$name.pid"
  done
  local ready pid rss_total=0
  for _ in $(seq 1 1200); do
    ready=0
    for i in $(seq "$first" $((first + count - 1))); do
      name="$PREFIX$i"; pid=$(cat "$DIR/$name.pid")
      kill -0 "$pid" 2>/dev/null || { grep -m5 -E "^[FE][0-9]{4}|^fatal|^panic" "$DIR/$name.log" >&2; die "hollow node $name (PID $pid) exited"; }
      [ -f "$DIR/$name.ready" ] && { ready=$((ready + 1)); continue; }
      if api "https://127.0.0.1:$PORT/api/v1/nodes/$name" 2>/dev/null | tr -d ' \n' | grep -q '"type":"Ready","status":"True"'; then
        touch "$DIR/$name.ready"; ready=$((ready + 1))
      fi
    done
    [ "$ready" = "$count" ] && break
    sleep 0.5
  done
  [ "$ready" = "$count" ] || die "only $ready of $count hollow nodes Ready after 600 s (logs in $DIR)"
  local pods
  pods=$(api "https://127.0.0.1:$PORT/api/v1/nodes/$PREFIX$first" | tr -d ' \n' | grep -o '"allocatable":{[^}]*' | grep -o '"pods":"[0-9]*"' | grep -o '[0-9]*')
  [ "$pods" = "$max_pods" ] || die "hollow node $PREFIX$first reports $pods allocatable pods, not $max_pods"
  for i in $(seq "$first" $((first + count - 1))); do rss_total=$((rss_total + $(rss_kb "$(cat "$DIR/$PREFIX$i.pid")"))); done
  log "$count hollow nodes Ready in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s" \
    "($PREFIX$first..$PREFIX$((first + count - 1)), $max_pods pods each, $((rss_total / count / 1024)) MB RSS each," \
    "PIDs in $DIR/*.pid)"
}

stop() {
  [ -d "$DIR" ] || return 0
  local f pid name n=0
  for f in "$DIR/$PREFIX"*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f"); name=$(basename "$f" .pid)
    if kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid" 2>/dev/null; n=$((n + 1)); fi
  done
  for f in "$DIR/$PREFIX"*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  done
  # their Node objects: the scheduler would otherwise keep them (NotReady) until the
  # node lifecycle controller evicts their pods, minutes later
  for f in "$DIR/$PREFIX"*.pid; do
    [ -f "$f" ] || continue
    name=$(basename "$f" .pid)
    api -X DELETE "https://127.0.0.1:$PORT/api/v1/nodes/$name" >/dev/null 2>&1 || true
    rm -f "$f" "$DIR/$name.ready"
  done
  log "stopped $n hollow nodes"
}

status() {
  [ -d "$DIR" ] || return 0
  local f pid
  for f in "$DIR/$PREFIX"*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
      echo "$(basename "$f" .pid) pid=$pid rss_mb=$(($(rss_kb "$pid") / 1024))"
    else
      echo "$(basename "$f" .pid) pid=$pid exited"
    fi
  done
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) stop ;;
  status) status ;;
  *) die "usage: k8s-hollow-nodes.sh start N [MAX_PODS] | stop | status" ;;
esac
