#!/bin/bash
# orchard/serve:test for the project's offline one-node cluster (no registry, no internet): the
# packages `orchard-async serve --adapter kubernetes` imports, copied from this checkout's venv
# onto orchard/python:test (Debian's Python 3.11, the venv's ABI), the checkout at the path the
# venv's editable install points to. For real deployments build ./Dockerfile instead.
#   bash deploy/service/build-test-image.sh [VENV]        (default /work/venv)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
venv=${1:-/work/venv}
site=$(echo "$venv"/lib/python3.11/site-packages)
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/site" "$ctx/repo"
packages="aiohttp aiohappyeyeballs aiosignal attr attrs frozenlist multidict propcache yarl idna anyio sniffio
  httpx httpcore h11 certifi msgspec rich markdown_it mdurl pygments yaml _yaml kubernetes_asyncio dateutil six.py
  urllib3 typing_extensions.py orchard_async-0.1.0.dist-info __editable__.orchard_async-0.1.0.pth
  __editable___orchard_async_0_1_0_finder.py"
for name in $packages; do
  [ -e "$site/$name" ] && cp -a "$site/$name" "$ctx/site/"
done
for name in orchard_async adapters recipes bench pyproject.toml; do
  cp -a "$repo/$name" "$ctx/repo/"
done
find "$ctx" -name __pycache__ -prune -exec rm -rf {} +
cat > "$ctx/Dockerfile" <<DOCKERFILE
FROM orchard/python:test
COPY site/ /usr/local/lib/python3.11/dist-packages/
COPY repo/ $repo/
RUN printf '#!/usr/bin/python3\nimport sys\nfrom orchard_async.apps.cli import console_main\nsys.exit(console_main())\n' > /usr/local/bin/orchard-async \
 && chmod 755 /usr/local/bin/orchard-async && chmod -R a+rX /usr/local/lib/python3.11/dist-packages $repo
USER 10001
ENTRYPOINT ["orchard-async"]
DOCKERFILE
docker build -q -t orchard/serve:test "$ctx"
docker run --rm orchard/serve:test serve --help | head -1
