#!/usr/bin/env bash
# Build the Kubernetes v1.20.2 server binaries the CI cluster runs, from Debian bookworm's
# `kubernetes` SOURCE package (no Kubernetes distribution can be downloaded here; the
# source tarball vendors every Go dependency, so the build runs with GOPROXY=off).
#
#   result: $K8S_CACHE/bin/{kube-apiserver,kube-controller-manager,kube-scheduler,kubemark,kubelet,pause}
#   cache:  /var/cache/k8s-from-debian (the same cache as ../shared/ci/k8s-build-from-debian.sh)
#   time:   ~12 min on an idle 2-core machine (20-40 min under load); instant when cached
#
# Idempotent and safe to run concurrently: a second run waits on the cache's lock, then
# finds the binaries. Binaries are installed into the cache only once all of them built.
set -euo pipefail
K8S_CACHE=${K8S_CACHE:-/var/cache/k8s-from-debian}
WHAT=${WHAT:-"cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler cmd/kubemark cmd/kubelet"}
export DEBIAN_FRONTEND=noninteractive
log() { echo "k8s-build: $*"; }
have_all() { for b in $WHAT pause; do [ -x "$K8S_CACHE/bin/$(basename "$b")" ] || return 1; done; }

if have_all; then log "binaries already in $K8S_CACHE/bin"; exit 0; fi
mkdir -p "$K8S_CACHE"
exec 9>"$K8S_CACHE/.build.lock"
log "waiting for the build lock $K8S_CACHE/.build.lock (another build may hold it)"
flock 9
if have_all; then log "binaries already in $K8S_CACHE/bin (built by another run)"; exit 0; fi

T0=$(date +%s)
apt-get update -qq
apt-get install -y -qq --no-install-recommends golang-go golang-github-modern-go-reflect2-dev \
  dpkg-dev rsync gcc libc6-dev make >/dev/null

W=$(mktemp -d /tmp/k8s-src.XXXXXX)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/apt/sources.d" "$W/apt/lists/partial"
# the machine's own Debian archive, but its source indices
if ls /etc/apt/sources.list.d/*.sources >/dev/null 2>&1; then
  sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/*.sources > "$W/apt/sources.d/src.sources"
else
  sed -n 's/^deb /deb-src /p' /etc/apt/sources.list > "$W/apt/sources.d/src.list"
fi
APT=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$W/apt/sources.d" -o "Dir::State::Lists=$W/apt/lists")
apt-get "${APT[@]}" update -qq
cd "$W"
apt-get "${APT[@]}" source --download-only kubernetes >/dev/null 2>&1
dpkg-source -x kubernetes_*.dsc k8s >/dev/null
cd k8s
VER=v$(ls ../kubernetes_*.orig.tar.gz | sed 's/.*really\([0-9.]*\)\.orig.*/\1/; s/.*kubernetes_\([0-9.]*\)\.orig.*/\1/')
log "building $VER: $WHAT"
# vendored reflect2 v1.0.1 corrupts map iteration under Go >= 1.18 (Debian has Go 1.19);
# swap in Debian's packaged reflect2 v1.0.2 (same import path, go.mod/modules.txt untouched)
rm -rf vendor/github.com/modern-go/reflect2
cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2
rm -f vendor/github.com/modern-go/reflect2/go.mod
cat > "$W/version.env" <<EOF
KUBE_GIT_VERSION='$VER'
KUBE_GIT_MAJOR='$(echo "${VER#v}" | cut -d. -f1)'
KUBE_GIT_MINOR='$(echo "${VER#v}" | cut -d. -f2)'
KUBE_GIT_TREE_STATE='clean'
EOF
KUBE_GIT_VERSION_FILE="$W/version.env" HOME="$W/home" CGO_ENABLED=0 GOPROXY=off GOFLAGS=-mod=vendor \
  make WHAT="$WHAT"
mkdir -p "$W/out"
for b in $WHAT; do cp "_output/bin/$(basename "$b")" "$W/out/"; done
# the pod sandbox ("pause") binary for real mode
gcc -Os -static -DVERSION=3.2-local -o "$W/out/pause" build/pause/linux/pause.c
"$W/out/kube-apiserver" --version
mkdir -p "$K8S_CACHE/bin"
for f in "$W"/out/*; do cp "$f" "$K8S_CACHE/bin/.$(basename "$f").tmp" && mv "$K8S_CACHE/bin/.$(basename "$f").tmp" "$K8S_CACHE/bin/$(basename "$f")"; done
log "built in $(( $(date +%s) - T0 )) s into $K8S_CACHE/bin"
