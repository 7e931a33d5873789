#!/bin/bash
# Build the sandbox images without any registry (run scripts/docker-up.sh first), with the
# package's builder (orchard_async/images/build.py, what `orchard-async images build` runs):
#
#   orchard/busybox:test          static busybox + applet symlinks, `docker import`
#   orchard/bookworm:min          debootstrap --variant=minbase from this machine's apt mirror,
#                                 `docker import` (the base of the two below)
#   orchard/python:test           + python3 python3-pytest git patch (`docker build`, chroot fallback)
#   orchard/swe-python:bookworm   the SWE recipe's image (recipes declare theirs as IMAGES)
#
# An image whose spec is unchanged is skipped (a second run takes about a second); FORCE=1
# rebuilds. Extra arguments are passed on (e.g. `--adapter kubernetes`). Logs and work
# files: $ORCHARD_IMAGE_STATE (default /var/tmp/orchard-images).
#
# The package must be installed (pip install -e .): the Python used is $ORCHARD_PYTHON, else
# the active virtualenv's, else the one behind the `orchard-async` command, else the first
# python3/python that imports it.
set -euo pipefail
die() { echo "docker-images: ERROR: $*" >&2; exit 1; }

candidates=("${ORCHARD_PYTHON:-}" "${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}")
if command -v orchard-async >/dev/null 2>&1; then
  shebang=$(head -n 1 "$(command -v orchard-async)")
  candidates+=("${shebang#\#!}")
fi
candidates+=(python3 python)
py=""
for candidate in "${candidates[@]}"; do
  [ -n "$candidate" ] && "$candidate" -c 'import orchard_async.images' >/dev/null 2>&1 && { py=$candidate; break; }
done
[ -n "$py" ] || die "no Python here imports orchard_async: pip install -e . first (or set ORCHARD_PYTHON)"

args=(build --test)
[ "${FORCE:-0}" = 1 ] && args+=(--force)
exec "$py" -m orchard_async.images "${args[@]}" "$@"
