"""One writer per output: an exclusive lock on OUT.nc (and its checkpoint folder) for as long as it is written.

A run writing OUT.nc holds `fcntl.flock(LOCK_EX)` on the file OUT.nc.lock from before it looks at the output or
its checkpoint until the command ends; every other writer of a spherepde file (`write_dataset`: a comparison
report, a sweep member) holds the lock of its target while it writes it, unless this process already holds a
lock that covers the target.  A second writer of the same output is refused at once (CaseError, exit 2) with the
process id and command that the holder wrote into the lock file.

How a dead holder is told from a live one: it is not told by its pid (pids are reused) but by the kernel, which
releases a flock when the last descriptor of the locked file closes, that is when its process ends, by SIGKILL
or a power cut of the process all the same.  So a lock file left behind by a killed run blocks nothing: the next
run takes the lock on it at once.  (flock is per host: two machines writing one output on a network file system
are kept apart only where that file system forwards flock, as NFSv4 and Lustre with `flock` do.)

While an output's lock is held no other spherepde process can be writing it, so the temporary files of that
output (`write_dataset`'s `OUT.nc.spherepde-XXXXXXXX.tmp`, a name no one else gives a file) that are there belong
to writers that died: taking the lock removes them.  The lock file is opened without following a symbolic link
and must be a regular file of one link: a link planted at OUT.nc.lock would have had its target truncated and
rewritten.  The lock file is removed when the lock is released; it is unlinked while still locked and a new
holder checks that the file it locked is still the one at the path, so that two processes can never hold locks
on two different files of one name.
"""

import errno
import fcntl
import functools
import os
import re
import shlex
import stat
import sys
import time

from spherepde.base.errors import CaseError, printable

LOCK_SUFFIX = ".lock"
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS}  # flock is not supported there
# write_dataset's temporary files: OUT.nc + TEMPORARY_TAG + tempfile.mkstemp's 8 characters + ".tmp"
TEMPORARY_TAG = ".spherepde-"
_TEMPORARY_NAME = re.escape(TEMPORARY_TAG) + r"[a-z0-9_]{8}\.tmp"


class OutputLock:
    """The exclusive lock of one output path, held by this process (see the module docstring)."""

    def __init__(self, output: str | os.PathLike):
        self.given = os.fspath(output)  # as messages show it
        self.output = os.path.abspath(self.given)
        self.path = self.output + LOCK_SUFFIX
        self.descriptor: int | None = None

    def acquire(self, command: str) -> None:
        """Take the lock at once or raise a one-line CaseError naming the process that holds it; `command` is
        what the lock file says about this holder."""
        while True:
            descriptor = _open_lock_file(self.path)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(descriptor)
                os.close(descriptor)
                raise CaseError(f"output {self.given!r} is being written by another spherepde process "
                                f"({holder}); wait for it to end, or choose another output") from None
            except OSError as error:
                os.close(descriptor)
                if error.errno not in _NO_LOCKS:
                    raise
                # a file system without flock (some FUSE mounts): refusing every run there would be worse
                print(f"spherepde: warning: {self.path!r} cannot be locked here ({error.strerror}): nothing keeps a "
                      "second run from writing this output at the same time", file=sys.stderr)
                _remove(self.path)
                return
            except BaseException:
                os.close(descriptor)
                raise
            if _same_file(descriptor, self.path):
                break
            os.close(descriptor)  # the holder before us removed that file after we opened it: lock the new one
        os.ftruncate(descriptor, 0)
        # surrogateescape: a command line holding bytes that are not UTF-8 (a case file's Latin-1 name) as Python
        # decoded them from argv, written back as those bytes (`_holder` reads them with errors="replace")
        line = f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}: {command}\n"
        os.write(descriptor, line.encode(errors="surrogateescape"))
        self.descriptor = descriptor
        remove_stale_temporaries(self.output)

    def release(self) -> None:
        """Remove the lock file and drop the lock (a no-op when not held)."""
        if self.descriptor is None:
            return
        _remove(self.path)
        os.close(self.descriptor)
        self.descriptor = None

    def covers(self, path: str) -> bool:
        """Whether holding this lock makes this process the only writer of `path`: the output itself and the
        files of its checkpoint folder (solvers.checkpoint.checkpoint_folder)."""
        path = os.path.abspath(path)
        return path == self.output or path.startswith(self.output + ".checkpoint" + os.sep)


_held: list[OutputLock] = []  # the locks this process holds, in the order taken


def hold_output(output: str | os.PathLike, command: str | None = None) -> OutputLock:
    """Hold the lock of `output` until `release_all` (nothing happens when this process holds it already);
    a CaseError when another process holds it."""
    for lock in _held:
        if lock.covers(os.fspath(output)):
            return lock
    lock = OutputLock(output)
    lock.acquire(command or _command_line())
    _held.append(lock)
    return lock


def release_all() -> None:
    """Release every lock `hold_output` took, the last taken first."""
    while _held:
        _held.pop().release()


def one_writer(write):
    """A decorator for write(dataset, path, ...): the write holds the lock of `path` unless a lock this process
    holds covers it already (a run writing its own output and checkpoint)."""
    @functools.wraps(write)
    def locked(dataset, path, *args, **kwargs):
        if any(lock.covers(os.fspath(path)) for lock in _held):
            return write(dataset, path, *args, **kwargs)
        lock = OutputLock(path)
        try:
            lock.acquire(_command_line())
        except OSError:  # no lock file can be made there (a missing or read-only folder): the write says why
            return write(dataset, path, *args, **kwargs)
        try:
            return write(dataset, path, *args, **kwargs)
        finally:
            lock.release()
    return locked


def remove_stale_temporaries(output: str) -> list[str]:
    """Delete the temporary files `write_dataset` left beside `output` (OUT.nc.spherepde-XXXXXXXX.tmp); call it only
    while holding the output's lock, which makes their writers dead.  Returns the paths removed."""
    folder, name = os.path.split(os.path.abspath(output))
    pattern = re.compile(re.escape(name) + _TEMPORARY_NAME)
    removed = []
    try:
        entries = os.listdir(folder)
    except OSError:
        return removed
    for entry in entries:
        if pattern.fullmatch(entry):
            try:
                os.remove(os.path.join(folder, entry))
                removed.append(os.path.join(folder, entry))
            except FileNotFoundError:
                pass
    return removed


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _open_lock_file(path: str) -> int:
    """A descriptor of the lock file at `path` (made if missing), or a CaseError where that is not a regular file of
    its own (a symbolic or hard link to another file, a folder).  A file of no link is one its holder removed as
    it released it after we opened it: the caller's `_same_file` then opens the path again."""
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as error:
        if error.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise
        descriptor = None
    if descriptor is not None:
        status = os.fstat(descriptor)
        if stat.S_ISREG(status.st_mode) and status.st_nlink <= 1:
            return descriptor
        os.close(descriptor)
    raise CaseError(f"{path!r}, the output's lock file, is not a regular file of its own (a link to another file, or "
                    "a folder); remove it")


def _same_file(descriptor: int, path: str) -> bool:
    try:
        here, there = os.fstat(descriptor), os.lstat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _holder(descriptor: int) -> str:
    """What the lock file says about its holder, escaped to one printable line."""
    return printable(os.pread(descriptor, 4096, 0).decode(errors="replace").strip()) or "a process starting up"


def _command_line() -> str:
    """This process's command line, for the lock file."""
    return shlex.join(sys.argv) or "python"
