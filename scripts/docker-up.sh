#!/bin/bash
# Start a local Docker daemon for orchard-async's tests (Debian 12, root, no systemd, no registry).
#
#  1. apt-get install docker.io debootstrap busybox-static, only those missing
#     (one `apt-get update` first when something has to be installed).
#  2. Unless a daemon already answers `docker info`, start dockerd by hand in its own session,
#     log in $ORCHARD_DOCKERD_LOG, PID in $ORCHARD_DOCKERD_PID (only written when we start one),
#     and wait up to $ORCHARD_DOCKERD_WAIT seconds for `docker info`.
#     dockerd always starts in the host's network and mount namespaces, even when this script
#     runs inside private ones (the tests under `scripts/ci-kubernetes.sh run` restart it from
#     there): `nsenter -t HOST -n -m`, HOST being $ORCHARD_HOST_NS_PID (ci-kubernetes.sh sets
#     it to its own PID, outside) or else PID 1. A dockerd in the private network namespace
#     would lose its bridge networking when that namespace goes (and be killed with it); in
#     the private mount namespace its container mounts would be invisible to the host.
#
# Idempotent: a second run with the daemon up costs one `docker info` (well under a second).
# Stop it with scripts/docker-down.sh. Every `docker info` is bounded by `timeout`: Debian's
# dockerd 20.10 has been seen to deadlock, and a hung daemon must not hang this script.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

LOG=${ORCHARD_DOCKERD_LOG:-/tmp/orchard-dockerd.log}
PIDFILE=${ORCHARD_DOCKERD_PID:-/tmp/orchard-dockerd.pid}
WAIT=${ORCHARD_DOCKERD_WAIT:-60}
DATA_ROOT=${ORCHARD_DOCKER_DATA_ROOT:-/var/lib/docker}
# extra dockerd flags, e.g. ORCHARD_DOCKERD_ARGS="--storage-driver=vfs"
EXTRA_ARGS=${ORCHARD_DOCKERD_ARGS:-}

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }
log() { echo "docker-up: $*"; }
die() { echo "docker-up: ERROR: $*" >&2; exit 1; }
answers() { timeout 5 docker info >/dev/null 2>&1; }
# alive PID: the process exists, is not a zombie, and is a dockerd (or the setsid that is
# about to exec it: right after the start, under load, the exec may not have happened yet)
alive() { local s; s=$(awk '{print $3}' /proc/"$1"/stat 2>/dev/null) || return 1
  [ -n "$s" ] && [ "$s" != Z ] && case "$(cat /proc/"$1"/comm 2>/dev/null)" in dockerd|setsid|nsenter) ;; *) false ;; esac; }

# The command prefix that puts dockerd into the host's network and mount namespaces, when
# this shell is not in them already (see 2. above).
host_namespaces() {
  local host=${ORCHARD_HOST_NS_PID:-1} mine theirs
  mine=$(readlink /proc/self/ns/net)
  if ! theirs=$(readlink "/proc/$host/ns/net" 2>/dev/null); then
    log "cannot read the network namespace of PID $host (set ORCHARD_HOST_NS_PID to a host process); dockerd starts in this one" >&2
    return 0
  fi
  if [ "$mine" != "$theirs" ]; then
    command -v nsenter >/dev/null || die "nsenter missing (util-linux): needed to start dockerd in the host's namespaces"
    log "this shell is in network namespace $mine, the host's is $theirs: dockerd starts there (nsenter -t $host -n -m)" >&2
    echo "nsenter -t $host -n -m"
  fi
}

[ "$(id -u)" = 0 ] || die "must run as root"

# ---- 1. packages -------------------------------------------------------------------------------
t=$(now)
missing=()
for p in docker.io debootstrap busybox-static; do
  st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [ "$st" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]} (apt-get update + install, ~1 min)"
  apt-get update -qq >/tmp/orchard-apt.log 2>&1 || { tail -20 /tmp/orchard-apt.log >&2; die "apt-get update failed"; }
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >>/tmp/orchard-apt.log 2>&1 \
    || { tail -30 /tmp/orchard-apt.log >&2; die "apt-get install ${missing[*]} failed"; }
  log "packages installed in $(since "$t") s"
fi
command -v dockerd >/dev/null || die "dockerd not found after installing docker.io"
command -v docker >/dev/null || die "docker CLI not found after installing docker.io"

# ---- 2. daemon ---------------------------------------------------------------------------------
# Two concurrent runs must not race over the pidfile.
exec 9>"${PIDFILE}.lock"
flock -w "$WAIT" 9 || die "another docker-up.sh holds ${PIDFILE}.lock"
if answers; then
  log "a Docker daemon already answers; nothing to start"
  exit 0
fi

# A dockerd we started earlier may still be alive (starting up, or hung): never start a second one.
ours=""
if [ -s "$PIDFILE" ]; then
  p=$(cat "$PIDFILE")
  if [ -n "$p" ] && alive "$p"; then
    ours=$p
    log "dockerd $p (started earlier by this script) is alive but not answering yet; waiting"
  else
    rm -f "$PIDFILE"   # stale
  fi
fi

t=$(now)
if [ -z "$ours" ]; then
  mkdir -p "$DATA_ROOT"
  enter=$(host_namespaces)
  # setsid: own session/process group, detached from this shell; stdin from /dev/null.
  # nsenter (when needed) enters the namespaces and execs dockerd: the PID stays the same.
  # shellcheck disable=SC2086
  setsid $enter dockerd --data-root="$DATA_ROOT" $EXTRA_ARGS >"$LOG" 2>&1 </dev/null 9>&- &
  ours=$!
  echo "$ours" >"$PIDFILE"
  log "started dockerd pid $ours (log $LOG)"
fi

deadline=$(( $(date +%s) + WAIT ))
# Running, under whatever name: right after the start, the process may still be setsid or
# nsenter about to exec dockerd (alive() checks the name, and a loaded machine has been seen to
# fail it there, removing the pidfile of a dockerd that then came up).
running() { local s; s=$(awk '{print $3}' /proc/"$1"/stat 2>/dev/null) || return 1; [ -n "$s" ] && [ "$s" != Z ]; }
until answers; do
  if ! running "$ours"; then
    echo "---- last lines of $LOG ----" >&2; tail -30 "$LOG" >&2 || true
    rm -f "$PIDFILE"
    die "dockerd $ours exited before answering"
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "---- last lines of $LOG ----" >&2; tail -30 "$LOG" >&2 || true
    die "dockerd $ours did not answer \`docker info\` within ${WAIT} s (stop it: scripts/docker-down.sh)"
  fi
  sleep 0.2
done
log "dockerd pid $ours ready in $(since "$t") s"
