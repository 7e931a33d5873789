"""What the in-sandbox daemons share: a secret that only they and the controller hold.

Runs inside the sandbox with any python3 (stdlib only). The controller hands each daemon a
fresh key on its stdin (never argv or the environment, which other processes of the sandbox
can read), and the daemon makes itself non-dumpable, so a process of the agent (same uid, no
CAP_SYS_PTRACE) can neither ptrace it nor read its memory through /proc. Whatever a daemon
tells the grader is signed with that key over a nonce the grader chose: a process that
replaced the daemon cannot produce the signature, so a forged state reads as forged.
"""

import ctypes
import hashlib
import hmac
import sys

PR_SET_DUMPABLE = 4


def read_key():
    """The key: the first line of stdin (hex). Then stdin is closed for good."""
    line = sys.stdin.readline().strip()
    sys.stdin.close()
    if len(line) < 32:
        raise SystemExit("no key on stdin")
    return bytes.fromhex(line)


def make_undumpable():
    """Deny ptrace and /proc/PID/mem to the agent's processes (best effort: a libc without
    prctl leaves the key as safe as the sandbox's ptrace policy makes it)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def sign(key, nonce, body):
    """The signature of a reply: HMAC-SHA256 over the nonce and the exact body bytes."""
    return hmac.new(key, nonce.encode() + b"\n" + body, hashlib.sha256).hexdigest()


def signed_request_ok(key, nonce, what, signature):
    """Whether a control request (reset, state) comes from the key's holder."""
    expected = hmac.new(key, ("request\n" + what + "\n" + nonce).encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, signature or "")
