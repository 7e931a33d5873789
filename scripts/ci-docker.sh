#!/bin/bash
# What CI runs before the docker tests: a Docker daemon that answers, and the test images.
#
#   1. scripts/docker-up.sh      install docker.io if missing, start dockerd unless one answers
#   2. scripts/docker-images.sh  `python -m orchard_async.images build --test`: the test images
#                                (orchard/busybox:test, orchard/python:test) and every recipe's
#                                (orchard/swe-python:bookworm), on orchard/bookworm:min; each is
#                                skipped while its spec is unchanged (reused across runs). Needs
#                                the package installed (.ci/run installs it first)
#   3. orchard-async reap        remove containers that earlier, killed runs left behind (only
#                                those whose controller is dead or whose TTL passed), so the
#                                tests' leak counts start from a clean daemon
#
# Idempotent: with the daemon up and the images built, a second run takes about a second.
# The daemon is left running; .ci/run stops it at the end with scripts/docker-down.sh.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log() { echo "ci-docker: $*"; }

"$here/docker-up.sh"
"$here/docker-images.sh"

if command -v orchard-async >/dev/null 2>&1; then
  timeout 120 orchard-async reap --adapter docker || log "reap failed (not fatal: the tests count their own containers)"
else
  log "orchard-async is not installed yet; skipped reaping leftovers"
fi
log "docker ready for the tests"
