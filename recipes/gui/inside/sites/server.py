"""Serve the bundled sites on the sandbox's loopback, one port each, in one process.

    python3 server.py < key      (the key's hex on stdin; see common.py)

Writes ``ready`` to the path given by --ready once every site listens.
"""

import argparse
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
PORTS = {"shop": 7101, "booking": 7102, "forum": 7103}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready", required=True)
    parser.add_argument("--sites", default=",".join(SITES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    key = read_key()
    make_undumpable()
    for name in args.sites.split(","):
        app = SITES[name]()
        app.reset(args.seed)
        serve(app, PORTS[name], key)
    with open(args.ready, "w") as ready:
        ready.write("ready\n")
    threading.Event().wait()


if __name__ == "__main__":
    main()
