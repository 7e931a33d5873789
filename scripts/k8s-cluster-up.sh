#!/bin/bash
# Start a local Kubernetes v1.20.2 control plane (binaries from scripts/k8s-build.sh).
#
#   MODE=apiserver : etcd + kube-apiserver only (ServiceAccount admission off; pods stay Pending)
#   MODE=fake      : + kube-controller-manager + kube-scheduler + kubemark hollow node (fake runtime)
#   MODE=real      : + kube-controller-manager + kube-scheduler + containerd + a real kubelet
#
# fake and real write iptables chains and mounts: run them inside a private network (and
# mount) namespace, which is what `scripts/ci-kubernetes.sh run -- CMD` does. real mode needs
# containerd, containernetworking-plugins and the images in $IMAGES (ctr-importable tarballs
# from scripts/k8s-images.py), and a non-loopback default route (a veth).
#
# Writes $WORK/kubeconfig (context "local", user admin) and $WORK/*.pid; every listener is on
# 127.0.0.1. Stop with scripts/k8s-cluster-down.sh. Uses curl, not kubectl.
#
# Sub-commands for tests that cut the control plane (run in the same namespaces):
#   k8s-cluster-up.sh apiserver-stop    stop kube-apiserver (by its recorded PID)
#   k8s-cluster-up.sh apiserver-start   start it again with the same flags, wait for /readyz
set -euo pipefail
MODE=${MODE:-apiserver}
K8S_BIN=${K8S_BIN:-/var/cache/k8s-from-debian/bin}
ETCD=${ETCD:-/usr/bin/etcd}
WORK=${WORK:-/tmp/orchard-k8s}
PORT=${PORT:-16443}
POD_CIDR=${POD_CIDR:-10.88.76.0/22}
MAX_PODS=${MAX_PODS:-250}
# processes per pod (the kubelet's podPidsLimit): Kubernetes has no per-pod pids field, so
# this node-wide cap is the only pids limit a sandbox pod gets (spec.pids is not enforced)
POD_MAX_PIDS=${POD_MAX_PIDS:-1024}
mkdir -p "$WORK"; cd "$WORK"
T0=$(date +%s.%N)
el() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'; }
log() { echo "k8s-cluster-up: $*"; }
die() { echo "k8s-cluster-up: ERROR: $*" >&2; exit 1; }
api() { curl -sf --max-time 5 --cacert pki/ca.crt --cert pki/admin.crt --key pki/admin.key "https://127.0.0.1:$PORT$1"; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

wait_ready() {  # up to $1 tenths of a second for the apiserver's /readyz
  for i in $(seq 1 "$1"); do
    api /readyz >/dev/null 2>&1 && return 0
    alive apiserver.pid || { tail -20 apiserver.log >&2; die "kube-apiserver exited"; }
    sleep 0.1
  done
  tail -20 apiserver.log >&2; die "kube-apiserver not ready"
}

start_apiserver() {
  # the flags are kept in apiserver.args (one per line) so apiserver-start repeats them exactly
  mapfile -t args < apiserver.args
  "$K8S_BIN/kube-apiserver" "${args[@]}" >> apiserver.log 2>&1 &
  echo $! > apiserver.pid
}

case "${1:-}" in
  apiserver-stop)
    alive apiserver.pid || die "no running kube-apiserver recorded in $WORK/apiserver.pid"
    pid=$(cat apiserver.pid); kill -TERM "$pid"
    for i in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && { kill -KILL "$pid"; sleep 0.2; }
    log "kube-apiserver $pid stopped"; exit 0 ;;
  apiserver-start)
    alive apiserver.pid && die "kube-apiserver $(cat apiserver.pid) is already running"
    start_apiserver; wait_ready 1200
    log "kube-apiserver $(cat apiserver.pid) ready in $(el) s"; exit 0 ;;
  "") ;;
  *) die "unknown sub-command $1 (apiserver-stop, apiserver-start)" ;;
esac

[ -x "$K8S_BIN/kube-apiserver" ] || die "no kube-apiserver in $K8S_BIN: run scripts/k8s-build.sh"
for p in *.pid; do [ -f "$p" ] && alive "$p" && die "$WORK/$p is alive: a cluster already runs here (scripts/k8s-cluster-down.sh)"; done
rm -f ./*.pid

# --- PKI (self-signed CA, serving cert, admin client cert, SA key), reused across runs ---
if [ ! -f pki/admin.crt ]; then
  mkdir -p pki; (
  cd pki
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -subj /CN=orchard-local-ca -days 3650 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj /CN=kube-apiserver 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n' > srv.ext
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile srv.ext -out apiserver.crt 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj "/CN=admin/O=system:masters" 2>/dev/null
  printf 'extendedKeyUsage=clientAuth\n' > cli.ext
  openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile cli.ext -out admin.crt 2>/dev/null
  openssl genrsa -out sa.key 2048 2>/dev/null; openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null )
fi
log "pki: $(el) s"
cat > kubeconfig <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://127.0.0.1:$PORT", certificate-authority: $WORK/pki/ca.crt}
users:
- name: admin
  user: {client-certificate: $WORK/pki/admin.crt, client-key: $WORK/pki/admin.key}
contexts:
- name: local
  context: {cluster: local, user: admin}
current-context: local
EOF

# --- etcd + kube-apiserver ---
rm -rf "$WORK/etcd-data"
"$ETCD" --data-dir "$WORK/etcd-data" --listen-client-urls http://127.0.0.1:12379 --advertise-client-urls http://127.0.0.1:12379 \
  --listen-peer-urls http://127.0.0.1:12380 --initial-advertise-peer-urls http://127.0.0.1:12380 \
  --initial-cluster default=http://127.0.0.1:12380 > etcd.log 2>&1 &
echo $! > etcd.pid
ADM=""; [ "$MODE" = apiserver ] && ADM="--disable-admission-plugins=ServiceAccount"
printf '%s\n' --etcd-servers=http://127.0.0.1:12379 --bind-address=127.0.0.1 --advertise-address=127.0.0.1 \
  --secure-port=$PORT --insecure-port=0 --tls-cert-file=pki/apiserver.crt --tls-private-key-file=pki/apiserver.key \
  --client-ca-file=pki/ca.crt --service-account-key-file=pki/sa.pub --service-account-signing-key-file=pki/sa.key \
  --service-account-issuer=https://kubernetes.default.svc --service-cluster-ip-range=10.96.0.0/24 \
  --authorization-mode=Node,RBAC --allow-privileged=true --kubelet-preferred-address-types=Hostname,InternalIP \
  --kubelet-client-certificate=pki/admin.crt --kubelet-client-key=pki/admin.key $ADM > apiserver.args
: > apiserver.log
start_apiserver
wait_ready 1200
log "apiserver ready: $(el) s"
[ "$MODE" = apiserver ] && exit 0

# --- controllers + scheduler ---
"$K8S_BIN/kube-controller-manager" --kubeconfig=kubeconfig --leader-elect=false --port=0 --secure-port=0 \
  --service-account-private-key-file=pki/sa.key --root-ca-file=pki/ca.crt --use-service-account-credentials=false \
  --cluster-signing-cert-file=pki/ca.crt --cluster-signing-key-file=pki/ca.key \
  --kube-api-qps=100 --kube-api-burst=200 > kcm.log 2>&1 &
echo $! > kcm.pid
"$K8S_BIN/kube-scheduler" --kubeconfig=kubeconfig --leader-elect=false --port=0 --secure-port=0 > sched.log 2>&1 &
echo $! > sched.pid

if [ "$MODE" = fake ]; then
  NODE=hollow-node-1
  "$K8S_BIN/kubemark" --morph=kubelet --name=$NODE --kubeconfig=kubeconfig --kubelet-port=20250 --kubelet-read-only-port=0 > node.log 2>&1 &
  echo $! > node.pid
else
  NODE=localhost
  command -v containerd >/dev/null || die "containerd missing (apt-get install containerd)"
  [ -x /usr/lib/cni/bridge ] || die "CNI plugins missing (apt-get install containernetworking-plugins)"
  mkdir -p containerd cni/net.d
  cat > containerd/config.toml <<EOF
version = 2
root = "$WORK/containerd/root"
state = "$WORK/containerd/state"
[grpc]
  address = "$WORK/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  restrict_oom_score_adj = true
  sandbox_image = "local/pause:3.2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$WORK/cni/net.d"
EOF
  # isDefaultGateway: pods get a default route via the bridge (the node), as a real cluster's do
  cat > cni/net.d/10-local.conflist <<EOF
{"cniVersion": "0.4.0", "name": "local", "plugins": [{"type": "bridge", "bridge": "k8slocal0", "isGateway": true, "isDefaultGateway": true, "ipMasq": false,
 "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "dataDir": "$WORK/cni/ipam"}}]}
EOF
  # the kubelet's pod cgroups are ours to remove at the end only if none existed before
  if [ -d /sys/fs/cgroup/cpu/kubepods ] || [ -d /sys/fs/cgroup/kubepods ]; then rm -f cgroups.ours; else touch cgroups.ours; fi
  containerd --config "$WORK/containerd/config.toml" > containerd.log 2>&1 &
  echo $! > containerd.pid
  for i in $(seq 1 100); do [ -S containerd/containerd.sock ] && break; sleep 0.1; done
  [ -S containerd/containerd.sock ] || { tail -20 containerd.log >&2; die "containerd did not start"; }
  for img in ${IMAGES:-}; do ctr --address containerd/containerd.sock -n k8s.io images import "$img" >/dev/null; done
  # api qps/burst: the kubelet's pod status updates are what a burst of creates waits on
  "$K8S_BIN/kubelet" --kubeconfig=kubeconfig --container-runtime=remote \
    --container-runtime-endpoint=unix://$WORK/containerd/containerd.sock --cgroup-driver=cgroupfs \
    --root-dir=$WORK/kubelet --cert-dir=$WORK/kubelet-pki --hostname-override=$NODE --fail-swap-on=false \
    --make-iptables-util-chains=false --address=127.0.0.1 --read-only-port=0 --healthz-port=0 \
    --anonymous-auth=false --client-ca-file=pki/ca.crt --authorization-mode=AlwaysAllow \
    --pod-infra-container-image=local/pause:3.2 --eviction-hard='nodefs.available<1%,imagefs.available<1%' \
    --image-gc-high-threshold=100 --image-gc-low-threshold=99 --max-pods=$MAX_PODS --pod-max-pids=$POD_MAX_PIDS \
    --kube-api-qps=100 --kube-api-burst=200 --serialize-image-pulls=false > node.log 2>&1 &
  echo $! > node.pid
fi
for i in $(seq 1 1200); do
  api "/api/v1/nodes/$NODE" 2>/dev/null | tr -d ' \n' | grep -q '"type":"Ready","status":"True"' && break
  [ "$i" = 1200 ] && { tail -20 node.log >&2; die "node $NODE not Ready"; }
  alive node.pid || { tail -20 node.log >&2; die "the node process exited"; }
  sleep 0.1
done
for i in $(seq 1 300); do api /api/v1/namespaces/default/serviceaccounts/default >/dev/null 2>&1 && break; sleep 0.1; done
log "node $NODE ready: $(el) s"
