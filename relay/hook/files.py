"""Private files for the hook: 0700 directories, 0600 files, atomic replace, writes in place
under a lock, bounded locks."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time

from relay.hook import codec


def private_dir(path: str) -> str:
    """Create `path`, and any missing parents, readable by the owner only; return it.

    Directories that already exist keep their mode: they are the user's choice.
    """
    if not os.path.isdir(path):
        parent = os.path.dirname(path.rstrip("/"))
        if parent and parent != path:
            private_dir(parent)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if not os.path.isdir(path):  # a file in its place: say so, not "File exists"
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path) from None
    return path


def own_dir(path: str) -> str:
    """`path` as a folder of this user's alone, created if missing; OSError when it is
    anything else (another user's, open to others, a symlink): in a shared temporary
    directory, a folder made in advance by someone else must not receive this user's log."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    if not is_own_dir(path):
        raise PermissionError(f"{path} is not a private folder of this user's")
    return path


def is_own_dir(path: str) -> bool:
    """Whether `path` is a folder (no symlink) of this user's, closed to group and others:
    the one rule for the folders in a shared temporary directory the hook writes and
    `relay stats` reads (entries another user planted there are not this user's runs)."""
    try:
        found = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(found.st_mode) and found.st_uid == os.getuid() and not found.st_mode & 0o077


def read_bytes(path: str, limit: int) -> bytes | None:
    """The file's content, or None when it is missing, unreadable, larger than `limit` or not
    a regular file: a FIFO in a session file's place held the hook on open() until the agent
    gave up on it (O_NONBLOCK opens it at once, and it is not read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return None if len(data) > limit else data


def read_owned_object(path: str, limit: int, key: str, owner: object) -> dict | None:
    """The JSON object stored at `path` when it is whole and its `key` names `owner`
    (a session's state, the breaker of one server URL); None for anything else."""
    raw = read_bytes(path, limit)
    if raw is None:
        return None
    try:
        stored = codec.loads(raw)
    except ValueError:
        return None
    if not isinstance(stored, dict) or stored.get(key) != owner:
        return None
    return stored


def _write_all(fd: int, data: bytes) -> None:
    """All of `data` from the descriptor's position (a write may take only part)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_atomic(path: str, data: bytes) -> None:
    """Write to a private temporary file beside `path`, then rename over it."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def rewrite_locked(path: str, data: bytes) -> None:
    """Write `data` over the file at `path` in place: for a file read and changed only under a
    lock the caller holds (a session's state; not the breaker's, read without one).

    A rename over the file, as write_atomic does, made ext4 write the new file out before the
    rename returned (auto_da_alloc, its guard against empty files after a crash): 15 to 440
    ms at times while other writes ran, in the gate of the prompt waiting for it and past its
    deadline (strace of the hook; in a replay, 17 of 400 prompts of kept sessions had a gate
    over 20 ms, up to 629, and fresh sessions, whose file is new, none). A write cut short
    leaves the new start before the old tail, which does not parse and reads as a fresh
    session. Anything but a regular file of this user's (another user's, a link, a FIFO) is
    replaced as before.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError:
        return write_atomic(path, data)
    try:
        found = os.fstat(fd)
        if stat.S_ISREG(found.st_mode) and found.st_uid == os.getuid():
            _write_all(fd, data)  # from offset 0: the file was just opened
            if found.st_size > len(data):  # a shorter state than before: its old tail goes
                os.ftruncate(fd, len(data))  # (not otherwise: 27 us of metadata update)
            return
    finally:
        os.close(fd)
    write_atomic(path, data)


class Lock:
    """An exclusive flock on `path`, waited for no later than `until` (time.monotonic()).

    `held` tells whether it was taken; callers decide what to do without it. `error` is the
    OSError that kept the lock file from being opened (a state folder this user cannot
    write), None when it was only busy: unwritable state is not contention. The
    wait polls a non-blocking flock because a blocking one cannot be bounded. A lock
    file may be removed (only by a process holding it: the session sweep), so a lock
    taken on a file no longer at `path` is dropped and the one there now is taken:
    two processes never hold locks on two files of one name.
    """

    def __init__(self, path: str, until: float) -> None:
        self.path = path
        self.until = until
        self.fd = -1
        self.held = False
        self.error: OSError | None = None

    def __enter__(self) -> Lock:
        delay = 0.0005
        while True:
            try:
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            except OSError as exc:
                self.error = exc
                return self
            while True:
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() + delay > self.until:
                        return self
                    time.sleep(delay)
                    delay = min(delay * 2, 0.005)
                except OSError:
                    return self
            if _names(self.path, self.fd):
                self.held = True
                return self
            os.close(self.fd)  # removed while we waited: lock what is at `path` now
            self.fd = -1
            if time.monotonic() > self.until:
                return self

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = -1
        self.held = False


def _names(path: str, fd: int) -> bool:
    """Whether `path` still names the file open as `fd`."""
    try:
        there = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    here = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino)
