"""Serve the bundled sites on the sandbox's loopback, one port each, in one process.

    python3 server.py --ready PATH --sites shop=7101,booking=7102 < key   (the key's hex; see common.py)

Each site listens on the port given where that port is free: always in a sandbox with a
network namespace of its own. Where sandboxes share one network (the local adapter's with
the network on, or without isolation), another sandbox's site may hold it; the site then
listens on a port the kernel picks. Once every site listens, the ports they got are written
to --ready as a JSON object, site by name.
"""

import argparse
import errno
import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from booking import Booking  # noqa: E402
from common import make_undumpable, read_key  # noqa: E402
from forum import Forum  # noqa: E402
from shop import Shop  # noqa: E402
from web import serve  # noqa: E402

SITES = {"shop": Shop, "booking": Booking, "forum": Forum}


def listen(app, port, key):
    """The site on ``port``, or on a port the kernel picks where another process holds it."""
    try:
        return serve(app, port, key)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        return serve(app, 0, key)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready", required=True)
    parser.add_argument("--sites", required=True, help="name=port,... (the ports the tasks are written for)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    key = read_key()
    make_undumpable()
    ports = {}
    for item in args.sites.split(","):
        name, _, port = item.partition("=")
        app = SITES[name]()
        app.reset(args.seed)
        ports[name] = listen(app, int(port), key).server_address[1]
    with open(args.ready + ".tmp", "w") as ready:
        json.dump(ports, ready)
    os.rename(args.ready + ".tmp", args.ready)  # whole, or not there: start.py reads it once it exists
    threading.Event().wait()


if __name__ == "__main__":
    main()
