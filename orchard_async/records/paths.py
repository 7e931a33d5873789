"""Checks on the files and directories a command will write, made before any work starts.

A run that spends an hour of model calls and then finds it cannot write its output has
wasted the hour; so every output path is checked first: the right kind (a file where a
file is wanted, a directory where a directory is), and writable, proven by trying. The
checks create nothing that stays: a probe file is removed at once, and a directory that
does not exist yet is left for the writer to make.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from orchard_async.errors import ConfigError


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists (``lexists``: a dangling link counts)."""
    current = path
    while not os.path.lexists(current) and current != current.parent:
        current = current.parent
    return current


def _probe_directory(directory: Path, what: str, target: Path) -> None:
    """Prove files can be created in ``directory`` by creating and removing one.
    (``os.access`` is not proof: it says yes to root on a read-only mount or in /proc.)"""
    try:
        fd, probe = tempfile.mkstemp(prefix=".orchard-probe-", dir=directory)
    except OSError as exc:
        raise ConfigError(f"{what} {target}: cannot write in {directory} ({_reason(exc)})") from None
    os.close(fd)
    os.unlink(probe)


def _check_ancestors(path: Path, what: str) -> None:
    """The directories above ``path`` exist or can be made: the closest existing one is a
    directory and files can be created in it."""
    ancestor = _nearest_existing(path.parent if path.parent != path else path)
    if not ancestor.is_dir():
        raise ConfigError(f"{what} {path}: {ancestor} is a file, not a directory")
    _probe_directory(ancestor, what, path)


def check_output_file(path: str | Path, *, what: str = "--out") -> Path:
    """``path`` can be written as a file: it is not a directory, and it (or the directory it
    will be made in) is writable. Creates and changes nothing."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{what} {path} is a directory; give a file name")
    if os.path.lexists(path):
        if not path.is_file():
            raise ConfigError(f"{what} {path} exists and is not a regular file")
        try:  # append mode and no write: neither the content nor the mtime changes
            with open(path, "ab"):
                pass
        except OSError as exc:
            raise ConfigError(f"{what} {path}: cannot write it ({_reason(exc)})") from None
        return path
    _check_ancestors(path, what)
    return path


def check_output_dir(path: str | Path, *, what: str = "--out") -> Path:
    """``path`` can be used as an output directory: it is a writable directory, or it does
    not exist and can be made. Creates nothing."""
    path = Path(path)
    if os.path.lexists(path):
        if not path.is_dir():
            raise ConfigError(f"{what} {path} is a file; give a directory")
        _probe_directory(path, what, path)
        return path
    _check_ancestors(path, what)
    return path
