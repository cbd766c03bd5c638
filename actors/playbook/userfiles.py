"""Reading a file a user names (a playbook, `--payload @file`, a server configuration)
without trusting what it is: only a regular file is read, and at most `limit` bytes.

A path can name anything: `/dev/zero` (or a symlink to it) reads until memory is gone,
`/dev/urandom` too, a FIFO with no writer blocks the reader for ever, a directory is
not text. So the file is opened non-blocking (opening a FIFO then returns at once), the
opened descriptor is checked (`fstat`: what was opened, after every symlink, not what
the path named a moment before) and only a regular file is read, up to its limit.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from actors.errors import UserError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class UnreadableFile(UserError, OSError):
    """A file that cannot or may not be read. An OSError (`filename`, `strerror`), whose
    text is one line: `PATH: why`."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def read_regular_file(path: str | Path, *, limit: int, what: str, over: str) -> bytes:
    """The bytes of the regular file at `path` (symlinks followed). UnreadableFile when it
    cannot be opened, is not a regular file, or holds more than `limit` bytes, then
    saying `{what} is N bytes, over {over}` ("the playbook", "the 1,048,576 bytes a
    playbook may be (...)"): why the limit is what it is."""
    name = str(path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise UnreadableFile(e.errno, e.strerror or str(e), name) from None
    try:
        size = _regular_size(fd, name)
        if size > limit:
            raise _too_large(name, f"{size:,}", what, over)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)  # one byte more tells a file that grew, or says 0 (/proc), past the limit
    except UnreadableFile:
        raise
    except OSError as e:
        raise UnreadableFile(e.errno, e.strerror or str(e), name) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise _too_large(name, f"more than {limit:,}", what, over)
    return data


def _regular_size(fd: int, name: str) -> int:
    """The size of the regular file open on `fd`; UnreadableFile naming what else it is."""
    mode = os.fstat(fd)
    if not stat.S_ISREG(mode.st_mode):
        kind = next((k for test, k in _KINDS if test(mode.st_mode)), "something else")
        target = os.path.realpath(name)
        via = f" ({target})" if target != os.path.abspath(name) else ""  # a symlink: say what it led to
        raise UnreadableFile(errno.EINVAL, f"{kind}{via}, not a regular file", name)
    return mode.st_size


def _too_large(name: str, size: str, what: str, over: str) -> UnreadableFile:
    return UnreadableFile(errno.EFBIG, f"{what} is {size} bytes, over {over}", name)
