"""Atomic file replacement.

A checkpoint file must never be seen half-written: a trainer killed in the middle of a save (OOM,
preemption, SIGKILL) has to leave the *previous* file loadable. :func:`atomic_write` gives the
caller a temporary path in the same folder, and only once the caller has written it completely
does it make the bytes durable and swap them in:

1. the caller writes the temporary ``.<name>.<random>.tmp`` (same folder, so ``os.replace`` is a
   rename within one file system, which POSIX makes atomic);
2. ``fsync`` the temporary, so the data is on disk before the name points at it;
3. ``os.replace`` it over the final name;
4. ``fsync`` the folder, so the rename itself survives a power loss.

If the caller raises (or the process is interrupted by an exception), the temporary is removed and
the previous file is left untouched. A process killed outright (SIGKILL) can leave a temporary
behind; its name starts with a dot and ends with ``.tmp`` so nothing mistakes it for the real file,
and it is safe to delete.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

TEMP_SUFFIX = ".tmp"
"""Suffix of temporaries; files ending with it are never the real thing."""


def temporary_name(path: str | os.PathLike[str]) -> Path:
    """A fresh temporary path next to ``path``: ``<folder>/.<name>.<random hex>.tmp``."""
    final = Path(path)
    return final.with_name(f".{final.name}.{secrets.token_hex(8)}{TEMP_SUFFIX}")


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Flush a file's (or a folder's) data and metadata to disk."""
    flags = os.O_RDONLY
    if os.path.isdir(path):
        flags |= getattr(os, "O_DIRECTORY", 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Write ``path`` all at once or not at all.

    Yields a temporary path in the same folder for the caller to write (with any writer:
    ``open``, ``torch.save``, a safetensors writer). When the ``with`` block ends normally the
    temporary is fsynced and renamed over ``path`` and the folder is fsynced; when it raises, the
    temporary is removed and ``path`` is left as it was.

    Example::

        with atomic_write(ckpt / "trainer_state.pt") as tmp:
            torch.save(state, tmp)

    Args:
        path: the final file name. Its folder must exist.

    Raises:
        FileNotFoundError: the folder of ``path`` does not exist.
    """
    final = Path(path)
    if not final.parent.is_dir():
        raise FileNotFoundError(f"{final.parent}: no such folder to save {final.name} into")
    tmp = temporary_name(final)
    try:
        yield tmp
        fsync_path(tmp)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(final.parent)
