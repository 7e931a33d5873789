"""Start the sites and the browser driver in this sandbox, wait until both are ready.

    python3 start.py --width 1280 --height 720 [--sites shop,booking,forum] [--any-host] [--marks] < key

Each daemon gets the key on its own stdin and runs in its own session (it outlives this
command). Prints a line of timings, then ``ports: {"shop": 7101, ...}``: where each site
listens (its usual port, unless another sandbox on a shared network holds it; see
sites/server.py). Exits non-zero, with the daemons' logs, if either does not come up in time.
"""

# HTML and messages are %-templates: long templates read better with positional fields.
# ruff: noqa: UP031

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
PORTS = {"shop": 7101, "booking": 7102, "forum": 7103}


def spawn(argv, key, log_path):
    log = open(log_path, "ab")
    process = subprocess.Popen(
        [sys.executable, *argv], stdin=subprocess.PIPE, stdout=log, stderr=log, cwd=HERE, start_new_session=True
    )
    process.stdin.write(key + b"\n")
    process.stdin.close()
    return process


def tail(path, size=2000):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - size))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", default="1280")
    parser.add_argument("--height", default="720")
    parser.add_argument("--sites", default="shop,booking,forum")
    parser.add_argument("--any-host", action="store_true")
    parser.add_argument("--marks", action="store_true")
    parser.add_argument("--seed", default="0")
    parser.add_argument("--timeout", type=float, default=50.0)  # a loaded host; the exec allows 60 s
    args = parser.parse_args()
    key = sys.stdin.readline().strip().encode()
    run = os.path.join(HERE, "run")
    os.makedirs(run, exist_ok=True)
    started = time.monotonic()
    sites_ready = os.path.join(run, "sites.ready")
    sites = spawn(
        [
            "sites/server.py",
            "--ready",
            sites_ready,
            "--sites",
            ",".join("%s=%d" % (name, PORTS[name]) for name in args.sites.split(",")),
            "--seed",
            args.seed,
        ],
        key,
        os.path.join(run, "sites.log"),
    )
    driver_argv = ["browserd.py", "--run", run, "--width", args.width, "--height", args.height]
    driver_argv += (["--any-host"] if args.any_host else []) + (["--marks"] if args.marks else [])
    driver = spawn(driver_argv, key, os.path.join(run, "browserd.log"))
    waiting = {"sites": sites_ready, "browser": os.path.join(run, "browser.ready")}
    ready_at = {}
    while waiting and time.monotonic() - started < args.timeout:
        for name, path in list(waiting.items()):
            if os.path.exists(path):
                ready_at[name] = time.monotonic() - started
                del waiting[name]
        for name, process in (("sites", sites), ("browser", driver)):
            if name in waiting and process.poll() is not None:
                print(
                    "%s exited with %s before it was ready:\n%s"
                    % (
                        name,
                        process.returncode,
                        tail(os.path.join(run, "sites.log" if name == "sites" else "browserd.log")),
                    )
                )
                return 1
        time.sleep(0.01)
    if waiting:
        print(
            "not ready after %.0fs: %s\n%s"
            % (args.timeout, ", ".join(waiting), tail(os.path.join(run, "browserd.log")))
        )
        return 1
    with open(sites_ready) as ready:
        ports = json.load(ready)
    for name in args.sites.split(","):
        urllib.request.urlopen("http://127.0.0.1:%d/__health" % ports[name], timeout=5).read()
    print("ready " + " ".join("%s=%.3f" % item for item in sorted(ready_at.items())))
    print("ports: " + json.dumps(ports, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
