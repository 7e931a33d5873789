#!/bin/bash
# Build orchard-async's local test images without any registry (run scripts/docker-up.sh first):
#
#   orchard/busybox:test   static busybox (Debian's busybox-static) + applet symlinks, `docker import`
#   orchard/bookworm:min   debootstrap --variant=minbase bookworm from the apt mirror configured on
#                          this machine, then `docker import`
#   orchard/python:test    orchard/bookworm:min + python3 python3-pytest git patch, via `docker build`
#                          (apt inside the build reaches the mirror through the default bridge); if that
#                          fails, apt-get in a chroot of an exported copy of orchard/bookworm:min, then
#                          `docker import`
#
# Each image that already exists (`docker image inspect`) is skipped, so a second run takes ~1 s.
# FORCE=1 rebuilds all three. ORCHARD_PY_BUILD=build|chroot forces one way for orchard/python:test
# (default auto: docker build, chroot if that fails).
# Work files and logs go to $ORCHARD_IMAGE_STATE (default /var/tmp/orchard-images).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

STATE=${ORCHARD_IMAGE_STATE:-/var/tmp/orchard-images}
FORCE=${FORCE:-0}
PY_METHOD=${ORCHARD_PY_BUILD:-auto}
BUSYBOX_IMAGE=orchard/busybox:test
MIN_IMAGE=orchard/bookworm:min
PY_IMAGE=orchard/python:test
PY_PACKAGES="python3 python3-pytest git patch"
# the legacy builder: Debian's docker.io has no buildx, and BuildKit is not needed for one RUN
export DOCKER_BUILDKIT=0

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }
log() { echo "docker-images: $*"; }
die() { echo "docker-images: ERROR: $*" >&2; exit 1; }
have() { [ "$FORCE" != 1 ] && docker image inspect "$1" >/dev/null 2>&1; }
# FORCE=1: drop the image that a rebuild replaced (left untagged), unless a container still uses it
image_id() { docker image inspect -f '{{.Id}}' "$1" 2>/dev/null || true; }
drop_replaced() { local new; new=$(image_id "$2")
  if [ -n "$1" ] && [ "$1" != "$new" ]; then docker rmi "$1" >/dev/null 2>&1 || true; fi; }
size() { docker image inspect -f '{{.Size}}' "$1" | awk '{printf "%.0f MB", $1/1e6}'; }
# Remove a chroot tree safely: first unmount whatever is still mounted below it (an interrupted
# debootstrap or chroot install could leave /proc or the /dev bind mount there), and never cross
# into another file system.
drop_tree() {
  local m
  for m in $(awk -v r="$1/" 'index($2, r) == 1 {print $2}' /proc/self/mounts | sort -r); do
    umount -l "$m" || true
  done
  rm -rf --one-file-system "$1"
}

[ "$(id -u)" = 0 ] || die "must run as root"
timeout 10 docker info >/dev/null 2>&1 || die "no Docker daemon answers: run scripts/docker-up.sh first"
mkdir -p "$STATE"
T0=$(now)

# The Debian mirror that apt uses here (the only one reachable): first deb URI serving bookworm,
# from deb822 *.sources files, else from one-line sources.list entries.
mirror() {
  local m=""
  m=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk 'BEGIN{RS=""; FS="\n"}
        { types=""; uris=""; suites=""
          for (i=1; i<=NF; i++) {
            if ($i ~ /^Types:/)  { types=$i }
            if ($i ~ /^URIs:/)   { uris=$i }
            if ($i ~ /^Suites:/) { suites=$i } }
          if (types ~ /(^|[ \t])deb([ \t]|$)/ && suites ~ /[ \t]bookworm([ \t]|$)/) {
            split(uris, u, /[ \t]+/); print u[2]; exit } }') || true
  if [ -z "$m" ]; then
    m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | sed 's/\[[^]]*\]//' |
        awk '$1=="deb" && $3=="bookworm" {print $2; exit}') || true
  fi
  echo "${m:-http://deb.debian.org/debian}"
}

# ---- orchard/busybox:test ----------------------------------------------------------------------
if have "$BUSYBOX_IMAGE"; then
  log "$BUSYBOX_IMAGE exists, skipped"
else
  t=$(now); old=$(image_id "$BUSYBOX_IMAGE")
  BB=/bin/busybox
  [ -x "$BB" ] && ! ldd "$BB" >/dev/null 2>&1 \
    || die "$BB is not the static busybox (apt-get install busybox-static; scripts/docker-up.sh does)"
  R="$STATE/rootfs-busybox"; drop_tree "$R"
  mkdir -p "$R"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,root,tmp,var/tmp}
  chmod 1777 "$R/tmp" "$R/var/tmp"
  cp "$BB" "$R/bin/busybox"
  # one symlink per applet at its usual place (bin/sh, usr/bin/env, sbin/..., ...)
  for p in $("$BB" --list-full); do
    case "$p" in */*) ;; *) continue ;; esac
    [ "$p" = bin/busybox ] && continue
    [ -e "$R/$p" ] || { mkdir -p "$R/$(dirname "$p")"; ln -s /bin/busybox "$R/$p"; }
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$R/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$R/etc/group"
  tar -C "$R" --numeric-owner --owner=0 --group=0 -c . |
    docker import -c 'ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin' -c 'CMD ["/bin/sh"]' - "$BUSYBOX_IMAGE" >/dev/null
  drop_tree "$R"
  # every applet the tests rely on must run
  out=$(docker run --rm --network none "$BUSYBOX_IMAGE" sh -ec '
    for a in sh base64 head tail wc sleep kill cat mkdir rm ls stat printf env timeout find dd; do
      command -v "$a" >/dev/null || { echo "missing $a"; exit 1; }
    done
    [ "$(printf "a\nb\nc\n" | head -n 2 | tail -n 1)" = b ]
    [ "$(printf hi | base64 | base64 -d)" = hi ]
    [ "$(printf "x\ny\n" | wc -l)" = 2 ]
    sleep 0; kill -0 $$; mkdir -p /tmp/d/e; ls /tmp/d >/dev/null; stat -c %s /etc/passwd >/dev/null
    find /tmp/d -name e | grep -q e; rm -r /tmp/d; cat /etc/passwd >/dev/null
    env | grep -q ^PATH=; timeout 5 sleep 0
    [ "$(dd if=/dev/zero bs=512 count=2 2>/dev/null | wc -c)" = 1024 ]
    echo applets-ok') || die "$BUSYBOX_IMAGE smoke test failed: $out"
  [ "$out" = applets-ok ] || die "$BUSYBOX_IMAGE smoke test: $out"
  drop_replaced "$old" "$BUSYBOX_IMAGE"
  log "$BUSYBOX_IMAGE built and checked in $(since "$t") s ($(size "$BUSYBOX_IMAGE"))"
fi

# ---- orchard/bookworm:min ----------------------------------------------------------------------
if have "$MIN_IMAGE"; then
  log "$MIN_IMAGE exists, skipped"
else
  t=$(now); old=$(image_id "$MIN_IMAGE")
  M=$(mirror)
  command -v debootstrap >/dev/null || die "debootstrap missing (scripts/docker-up.sh installs it)"
  R="$STATE/rootfs-min"; drop_tree "$R"
  log "debootstrap --variant=minbase bookworm from $M (~1 min)"
  debootstrap --variant=minbase bookworm "$R" "$M" >"$STATE/debootstrap.log" 2>&1 \
    || { tail -20 "$STATE/debootstrap.log" >&2; die "debootstrap failed (log $STATE/debootstrap.log)"; }
  log "  debootstrap: $(since "$t") s"
  t2=$(now)
  tar -C "$R" --numeric-owner --exclude='./var/cache/apt/archives/*.deb' --exclude='./var/lib/apt/lists/*' \
      --exclude='./proc/*' --exclude='./sys/*' --exclude='./dev/*' -c . |
    docker import -c 'CMD ["/bin/bash"]' - "$MIN_IMAGE" >/dev/null
  drop_tree "$R"
  log "  import: $(since "$t2") s"
  drop_replaced "$old" "$MIN_IMAGE"
  log "$MIN_IMAGE built in $(since "$t") s ($(size "$MIN_IMAGE"))"
fi

# ---- orchard/python:test -----------------------------------------------------------------------
build_py() {   # docker build: apt inside the build container, through the default bridge
  local apt_opts="-o Acquire::http::Timeout=20 -o Acquire::Retries=2"
  printf '%s\n' \
    "FROM $MIN_IMAGE" \
    "RUN apt-get $apt_opts update && DEBIAN_FRONTEND=noninteractive apt-get $apt_opts install -y --no-install-recommends $PY_PACKAGES && apt-get clean && rm -rf /var/lib/apt/lists/*" \
    'CMD ["/bin/bash"]' |
    timeout 900 docker build --force-rm -t "$PY_IMAGE" - >"$STATE/python-build.log" 2>&1
}
build_py_chroot() {   # fallback: apt in a chroot of an exported copy of orchard/bookworm:min
  local R="$STATE/rootfs-py" cid rc=0
  drop_tree "$R"; mkdir -p "$R"
  trap 'drop_tree "$STATE/rootfs-py"' EXIT
  cid=$(docker create "$MIN_IMAGE" /bin/true)
  docker export "$cid" | tar -C "$R" -x; docker rm "$cid" >/dev/null
  rm -f "$R/.dockerenv"
  cp /etc/resolv.conf "$R/etc/resolv.conf"; cp /etc/hosts "$R/etc/hosts"
  mount -t proc proc "$R/proc"
  mount --bind /dev "$R/dev"
  chroot "$R" /bin/sh -c "apt-get update && apt-get install -y --no-install-recommends $PY_PACKAGES && apt-get clean" \
    >"$STATE/python-chroot.log" 2>&1 || rc=$?
  umount "$R/dev" "$R/proc"
  [ "$rc" = 0 ] || { drop_tree "$R"; return "$rc"; }
  : >"$R/etc/resolv.conf"; printf '127.0.0.1\tlocalhost\n' >"$R/etc/hosts"
  tar -C "$R" --numeric-owner --exclude='./var/lib/apt/lists/*' -c . |
    docker import -c 'CMD ["/bin/bash"]' - "$PY_IMAGE" >/dev/null
  drop_tree "$R"
}
if have "$PY_IMAGE"; then
  log "$PY_IMAGE exists, skipped"
else
  t=$(now); old=$(image_id "$PY_IMAGE")
  if [ "$PY_METHOD" != chroot ] && build_py; then
    log "$PY_IMAGE built with docker build in $(since "$t") s"
  else
    if [ "$PY_METHOD" != chroot ]; then
      tail -15 "$STATE/python-build.log" >&2
      [ "$PY_METHOD" = build ] && die "docker build of $PY_IMAGE failed (log $STATE/python-build.log)"
      log "docker build could not install $PY_PACKAGES (log $STATE/python-build.log); chroot fallback"
    fi
    t2=$(now)
    build_py_chroot || { tail -20 "$STATE/python-chroot.log" >&2; die "chroot install failed (log $STATE/python-chroot.log)"; }
    log "$PY_IMAGE built in a chroot in $(since "$t2") s"
  fi
  docker run --rm --network none "$PY_IMAGE" sh -ec \
    'python3 -c "import sys; assert sys.version_info >= (3, 11)"; python3 -m pytest --version >/dev/null; git --version >/dev/null; patch --version >/dev/null' \
    || die "$PY_IMAGE smoke test failed"
  drop_replaced "$old" "$PY_IMAGE"
  log "$PY_IMAGE ready in $(since "$t") s ($(size "$PY_IMAGE"))"
fi

log "done in $(since "$T0") s: $BUSYBOX_IMAGE $MIN_IMAGE $PY_IMAGE"
