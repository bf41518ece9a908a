"""One process per run directory: an exclusive lock held for the run's life.

Two processes writing one run directory (two ``raydpfl run --resume DIR`` started a
second apart, ``run --out DIR`` into a live run, two attempts of one Tune trial) would
append their rounds to ``ledger_log.jsonl`` interleaved and break its hash chain. So every
writer of a run directory first takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on
``<run dir>/run.lock`` and holds it until the run ends; the file holds the holder's pid
(and host). The OS releases the lock when the holder dies, however it dies, so a crashed
run never leaves a directory locked. A second process is refused at once with
`RunDirBusyError` naming the directory and the holder's pid.

The lock guards the directory, not only the path of its file: the holder also takes
``flock`` on the directory itself, so deleting ``run.lock`` (which a SIGKILLed run leaves
behind, inviting just that) cannot let a second writer in while the first runs. A
``run.lock`` whose pid is gone on this host is recognised as stale: it is taken over and
a warning says so (`logging`, logger ``raydpfl.simulation.run_lock``). Where a directory
cannot be locked (some network file systems), the file lock alone guards it.

The lock is re-entrant within one thread (the CLI takes it before loading any data, and
`run_experiment`, which every run goes through, takes it again); another thread of the
same process is refused like another process. The lock file is removed when the lock is
released, so a finished run directory does not keep it.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

#: The lock file inside a run (or sweep) directory, present while a process runs it.
LOCK_FILE = "run.lock"

log = logging.getLogger(__name__)


class RunDirBusyError(RuntimeError):
    """Another process (or thread) is running in this run directory."""


@dataclass
class _Held:
    fd: int
    inode: tuple[int, int]
    thread: int
    count: int
    dir_fd: int | None = None


_HELD: dict[str, _Held] = {}
_GUARD = threading.Lock()


@contextmanager
def run_dir_lock(run_dir: str | Path, *, create: bool = True) -> Iterator[Path]:
    """Holds `run_dir`'s lock for the ``with`` block (creating the directory if asked).

    Raises:
        RunDirBusyError: Another process or thread holds it (the pid is named).
    """
    key = acquire_run_dir(run_dir, create=create)
    try:
        yield Path(run_dir)
    finally:
        release_run_dir(key)


def acquire_run_dir(run_dir: str | Path, *, create: bool = True) -> str:
    """Takes `run_dir`'s lock (see `run_dir_lock`); returns the key `release_run_dir` takes."""
    path = Path(run_dir)
    if create:
        path.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(path)
    me = threading.get_ident()
    with _GUARD:
        held = _HELD.get(key)
        if held is not None:
            if held.thread != me:
                raise RunDirBusyError(_busy(path, f"{os.getpid()} (another thread of this one)"))
            held.count += 1
            return key
        dir_fd = _lock_directory(path)
        try:
            fd, inode = _lock(path)
        except BaseException:
            if dir_fd is not None:
                os.close(dir_fd)
            raise
        _HELD[key] = _Held(fd, inode, me, 1, dir_fd)
    return key


def release_run_dir(key: str) -> None:
    """Releases one hold of the lock; the last one removes the lock file and unlocks."""
    with _GUARD:
        held = _HELD.get(key)
        if held is None:
            return
        held.count -= 1
        if held.count > 0:
            return
        del _HELD[key]
        lock_path = Path(key) / LOCK_FILE
        try:
            st = os.stat(lock_path)
            if (st.st_dev, st.st_ino) == held.inode:
                os.unlink(lock_path)  # before unlocking: a waiter then sees a stale inode
        except OSError:
            pass
        os.close(held.fd)  # releases the flock
        if held.dir_fd is not None:
            os.close(held.dir_fd)


def holds_run_dir(run_dir: str | Path) -> bool:
    """Whether this thread holds `run_dir`'s lock."""
    held = _HELD.get(os.path.realpath(Path(run_dir)))
    return held is not None and held.thread == threading.get_ident()


def check_not_busy(run_dir: str | Path) -> None:
    """Raises `RunDirBusyError` if a process other than this thread holds `run_dir`'s lock
    (without taking it; nothing is created)."""
    path = Path(run_dir)
    if holds_run_dir(path):
        return
    held = _HELD.get(os.path.realpath(path))
    if held is not None:
        raise RunDirBusyError(_busy(path, f"{os.getpid()} (another thread of this one)"))
    dir_fd = _open_directory(path)
    if dir_fd is not None:
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirBusyError(_busy(path, _holder_of(path))) from None
        except OSError:
            pass  # cannot lock a directory here: the file lock below decides
        finally:
            os.close(dir_fd)
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return  # no lock file: nobody runs here
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise RunDirBusyError(_busy(path, _holder(fd))) from None
    finally:
        os.close(fd)  # also drops the shared lock if it was taken


def _open_directory(path: Path) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None


def _lock_directory(path: Path) -> int | None:
    """The directory's own exclusive flock (its fd), None where directories cannot be
    locked; `RunDirBusyError` if another process holds it, even with run.lock deleted."""
    fd = _open_directory(path)
    if fd is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunDirBusyError(_busy(path, _holder_of(path))) from None
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EBADF, errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP):
            return None
        raise
    return fd


def _holder_of(path: Path) -> str:
    """The holder named by `path`'s run.lock, or words for a deleted one."""
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return f"another process (its {LOCK_FILE} was deleted)"
    try:
        return _holder(fd)
    finally:
        os.close(fd)


def _warn_if_stale(path: Path, fd: int) -> None:
    """Before a new holder writes its pid: says when the file named a process of this host
    that is gone (a run killed outright leaves its run.lock; it is harmless)."""
    try:
        words = os.pread(fd, 256, 0).decode("utf-8", "replace").split()
    except OSError:
        return
    if len(words) < 2 or not words[0].isdigit() or words[1] != socket.gethostname():
        return
    pid = int(words[0])
    if pid == os.getpid() or _alive(pid):
        return
    log.warning(
        "raydpfl: %s named pid %d, which is gone on this host (killed?): a stale lock, "
        "taken over (no need to delete it)",
        path / LOCK_FILE,
        pid,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def _lock(path: Path) -> tuple[int, tuple[int, int]]:
    lock_path = path / LOCK_FILE
    for _ in range(100):
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RunDirBusyError(_busy(path, holder)) from None
        except BaseException:
            os.close(fd)
            raise
        # A releasing holder unlinks the file before unlocking: the inode locked must be
        # the one still at the path, or the lock guards nothing.
        st = os.fstat(fd)
        try:
            now = os.stat(lock_path)
            same = (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)
        except FileNotFoundError:
            same = False
        if same:
            _warn_if_stale(path, fd)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
            return fd, (st.st_dev, st.st_ino)
        os.close(fd)
    raise RunDirBusyError(f"run directory {str(path)!r}: cannot take {LOCK_FILE} (contended)")


def _holder(fd: int) -> str:
    """The holder's pid as its lock file names it (and its host, when it is another)."""
    try:
        words = os.pread(fd, 256, 0).decode("utf-8", "replace").split()
    except OSError:
        words = []
    if not words or not words[0].isdigit():
        return "another process"
    host = f" on {words[1]}" if len(words) > 1 and words[1] != socket.gethostname() else ""
    return f"pid {words[0]}{host}"


def _busy(path: Path, holder: str) -> str:
    if holder[0].isdigit():
        holder = f"pid {holder}"
    return (
        f"run directory {str(path)!r} is in use by {holder} (its {LOCK_FILE}); "
        "one process at a time may write a run: wait for it to end or stop it "
        f"(deleting {LOCK_FILE} does not release it)"
    )
