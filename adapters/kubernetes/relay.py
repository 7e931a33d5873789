"""The relay in the pod: what lets the controller carry a sandbox's shell session over a
direct TCP connection to the pod IP instead of the API server's exec websocket (``podip``
is the controller's side). Pure: the program, the pod entry that starts it, the secret.

The pod's entry starts the relay in the background (when the image has ``python3``; without
it nothing listens and the controller falls back to the exec websocket), then execs the
self-destruct timer as before. The relay runs as the sandbox's user in the sandbox's
container: it can do nothing a command in the sandbox cannot already do.

Authentication: the controller makes a random secret per sandbox and keeps it in memory
only; the pod spec carries its SHA-256 (an argument of the entry), which is all the relay
holds. Whoever can read pods (or, inside the pod, ``/proc/<relay>/cmdline``) learns the
digest, not the secret; an env var or a Secret object would hand the secret itself to
every reader of pods (and, for an env var, to every command in the sandbox). The secret
crosses the pod network in clear (no TLS): it opens a shell in that one pod only, as the
sandbox's user.

Wire protocol, one connection per exec (the shell, each output relay, each stream, each
one-shot command): the controller sends ``<secret>\\n`` then ``{"argv": [...], "stdin":
bool}\\n``, then the process's stdin as raw bytes (its half-close is the stdin's EOF; a full
close also ends the process's stdin, so the shell ends its pod as with a closed exec
websocket). The relay answers in frames: one byte channel, four bytes big-endian length,
data. Channel 0 ``ok`` (the process started) or 9 (refused, with the reason) come first;
then 1 stdout, 2 stderr, and 3 the exit code in decimal, last.
"""

from __future__ import annotations

import hashlib
import secrets

RELAY_PORT = 7607
OK, STDOUT, STDERR, EXIT, REFUSED = 0, 1, 2, 3, 9

# python3 -c RELAY PORT DIGEST. Threads, not asyncio: it must run on any python3 an image
# has. TCP keepalive on each connection: a controller whose host vanished (no FIN) is seen
# within ~25 s, the process's stdin closes, and the shell ends its pod.
RELAY = r"""
import hashlib, hmac, json, os, socket, struct, subprocess, sys, threading
PORT, DIGEST = int(sys.argv[1]), sys.argv[2].encode()

def send(conn, lock, channel, data):
    with lock:
        conn.sendall(struct.pack(">BI", channel, len(data)) + data)

def pump(fd, conn, lock, channel):
    try:
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            send(conn, lock, channel, data)
    except OSError:
        pass

def feed(reader, stdin):
    try:
        while True:
            data = reader.read1(65536)
            if not data:
                break
            stdin.write(data)
            stdin.flush()
    except (OSError, ValueError):
        pass
    finally:
        try:
            stdin.close()
        except OSError:
            pass

def serve(conn):
    lock = threading.Lock()
    try:
        for option, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, option):
                conn.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # frames go out as they come
        reader = conn.makefile("rb")
        secret = reader.readline(256).strip()
        if not hmac.compare_digest(hashlib.sha256(secret).hexdigest().encode(), DIGEST):
            send(conn, lock, 9, b"refused: wrong secret")
            return
        header = json.loads(reader.readline(1 << 20))
        stdin = subprocess.PIPE if header.get("stdin") else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(header["argv"], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            send(conn, lock, 9, ("refused: %s" % exc).encode())
            return
        send(conn, lock, 0, b"ok")
        pumps = [threading.Thread(target=pump, args=(p.fileno(), conn, lock, c), daemon=True)
                 for p, c in ((proc.stdout, 1), (proc.stderr, 2))]
        for t in pumps:
            t.start()
        if proc.stdin is not None:
            threading.Thread(target=feed, args=(reader, proc.stdin), daemon=True).start()
        code = proc.wait()
        for t in pumps:
            t.join()
        send(conn, lock, 3, str(code if code >= 0 else 128 - code).encode())
    except (OSError, ValueError, KeyError, TypeError):
        pass
    finally:
        try:
            conn.shutdown(socket.SHUT_WR)  # our EOF; the stdin feeder reads on until the controller closes
        except OSError:
            pass
        conn.close()

def listener():
    try:
        srv = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("::", PORT))
    except OSError:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("0.0.0.0", PORT))
    srv.listen(64)
    return srv

srv = listener()
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""

# The pod's entry: the relay in the background when the image has python3 (its output goes
# to the container log), then the timer (or whatever command follows) as before. `$1` the
# relay program, `$2` the port, `$3` the secret's digest.
ENTRY = 'if command -v python3 >/dev/null 2>&1; then python3 -c "$1" "$2" "$3" </dev/null & fi; shift 3; exec "$@"'


def new_secret() -> str:
    return secrets.token_hex(32)


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def relay_entry(command: list[str], port: int, secret: str) -> list[str]:
    """``command`` (the pod's main process) preceded by the relay, which accepts ``secret``."""
    return ["sh", "-c", ENTRY, "orchard-entry", RELAY, str(port), digest(secret), *command]
