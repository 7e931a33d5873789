#!/bin/bash
# Stop the dockerd that scripts/docker-up.sh started (PID in $ORCHARD_DOCKERD_PID):
# SIGTERM, wait up to $ORCHARD_DOCKERD_STOP_WAIT s (default 20), then SIGKILL its process group.
# Does nothing when docker-up.sh did not start one (no pidfile, or the process is gone).
# dockerd leaves the docker0 bridge and its iptables rules behind; the next start reuses them.
set -euo pipefail

PIDFILE=${ORCHARD_DOCKERD_PID:-/tmp/orchard-dockerd.pid}
WAIT=${ORCHARD_DOCKERD_STOP_WAIT:-20}
log() { echo "docker-down: $*"; }
# alive PID: the process exists, is not a zombie, and is a dockerd
alive() { local s; s=$(awk '{print $3}' /proc/"$1"/stat 2>/dev/null) || return 1
  [ -n "$s" ] && [ "$s" != Z ] && [ "$(cat /proc/"$1"/comm 2>/dev/null)" = dockerd ]; }

if [ ! -s "$PIDFILE" ]; then
  log "no $PIDFILE: docker-up.sh started no dockerd; nothing to do"
  exit 0
fi
pid=$(cat "$PIDFILE")
case "$pid" in ''|*[!0-9]*) log "bad pidfile content '$pid'; removing it"; rm -f "$PIDFILE"; exit 0 ;; esac
if ! alive "$pid"; then
  log "dockerd $pid is not running; removing stale $PIDFILE"
  rm -f "$PIDFILE"
  exit 0
fi

t0=$(date +%s.%N)
kill -TERM "$pid"
deadline=$(( $(date +%s) + WAIT ))
while alive "$pid"; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    log "dockerd $pid still alive after ${WAIT} s; SIGKILL (process group $pid)"
    # docker-up.sh started it with setsid, so its process group id is its pid; this also takes
    # down the containerd it spawned.
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do alive "$pid" || break; sleep 0.1; done
    break
  fi
  sleep 0.1
done
rm -f "$PIDFILE"
log "dockerd $pid stopped in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
