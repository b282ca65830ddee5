"""File-system helpers for durable writes: syncing a directory, writing a file (synced or not),
replacing a file atomically.

A leaf: it imports the standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "replace_file", "write_file"]


def fsync_dir(path: str | Path) -> None:
    """``fsync`` directory ``path``, so that the names created, renamed or removed in it survive
    a crash (POSIX: a file's data sync does not cover its directory entry).

    Raises:
        OSError: the directory cannot be opened or synced.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: str | Path, data: bytes, *, fsync: bool) -> None:
    """Create (or truncate) ``path`` with ``data``; with ``fsync``, ``fsync`` it before returning
    (the directory entry is not synced: see :func:`fsync_dir`).

    Raises:
        OSError: the file cannot be written or synced.
    """
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        if fsync:
            os.fsync(f.fileno())


def replace_file(path: Path, data: bytes, *, fsync: bool) -> None:
    """Replace ``path`` with ``data`` atomically: written to ``<path>.tmp`` (synced with
    ``fsync``), then renamed over ``path``. A crash leaves the old or the new content, never a
    mix; with ``fsync`` the caller syncs the directory (:func:`fsync_dir`) to keep the rename.

    Raises:
        OSError: the file cannot be written, synced or renamed.
    """
    tmp = path.with_name(path.name + ".tmp")
    write_file(tmp, data, fsync=fsync)
    os.replace(tmp, path)
