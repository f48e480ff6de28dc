"""Files written whole or not at all: a temporary beside the target, flushed, then renamed.

A reader (or a run that resumes after a crash or a full disk) sees either the old file or the
complete new one, never half of one. A failed write raises :class:`WriteError`, one line that
names the file, the cause and the free space. Example::

    with atomic_open("runs/x/summary.json", "w") as f:
        json.dump(summary, f)
    with atomic_path("runs/x/model.h5") as temporary:     # for writers that take a path
        nn.save_parameters(temporary)
"""
import contextlib
import os
import shutil
import stat


class WriteError(OSError):
    """A file could not be written (disk full, quota, permissions...); the old file is kept.
    An OSError, so that code that reports a failed write as a line goes on doing so."""


class UnsafeFolder(RuntimeError):
    """A folder that must be private is another user's or writable by others."""


def temporary_path(path):
    """The temporary that :func:`atomic_path` writes for ``path``: same folder, same extension
    (writers such as nnabla's ``save_parameters`` pick the format from it), the writer's pid:
    ``runs/x/model.h5`` -> ``runs/x/model.tmp1234.h5``."""
    root, extension = os.path.splitext(path)
    return f"{root}.tmp{os.getpid()}{extension}"


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path to write ``path``'s new content to; on success flush it to disk
    and rename it over ``path`` (atomic on POSIX within one file system). On any error the
    temporary is removed, ``path`` is left as it was, and an OSError becomes WriteError.

    A ``path`` that exists and is not a regular file (``/dev/null``, ``/dev/stdout``, a named
    pipe) is written directly: a rename would replace the device with a file."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.exists(path) and not os.path.isfile(path):
        yield path
        return
    temporary = temporary_path(path)
    try:
        yield temporary
        with open(temporary, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(temporary, path)
        fsync_directory(folder)            # the rename itself survives a power loss
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)           # first, so that the free space counts its bytes
        cause = os_error_behind(e) if isinstance(e, Exception) else None
        if cause is None:
            raise
        raise WriteError(f"cannot write {path}: {describe(cause)}; {free_space(folder)}. "
                         f"Free some space or write elsewhere") from e


def os_error_behind(error):
    """The OSError ``error`` is or was raised while handling, or None. Writers wrap the
    disk's error: h5py raises RuntimeError ("Can't decrement id ref count") when closing a
    file whose write failed with ENOSPC."""
    while error is not None and not isinstance(error, OSError):
        error = error.__context__
    return error


def describe(error):
    """One line for an OSError: the system's words for its errno ("No space left on device"),
    else the first line of its message (h5py's run over several)."""
    if error.errno:
        return os.strerror(error.errno)
    return (str(error).splitlines() or [type(error).__name__])[0]


@contextlib.contextmanager
def atomic_open(path, mode="w"):
    """Open a temporary for writing (``mode`` "w" or "wb"), renamed over ``path`` on success:
    :func:`atomic_path` for code that writes to a file object."""
    with atomic_path(path) as temporary:
        with open(temporary, mode) as f:
            yield f


def free_space(directory):
    """"N MB free on the file system of ``directory``", or why that is unknown."""
    try:
        return f"{shutil.disk_usage(directory).free / 1e6:.1f} MB free on the file system " \
               f"of {directory}"
    except OSError as e:
        return f"free space of {directory} unknown ({e.strerror or e})"


def fsync_directory(directory):
    """Flush ``directory``'s entries (new and renamed names) to disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def private_folder(path, fix):
    """Create folder ``path`` (mode 0700) unless it exists; return it. Raise UnsafeFolder, one
    line ending with ``fix``, when it is another user's or writable by group or others: what
    such a folder holds (a library we load, a cache we trust) could be swapped under us."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    status = os.stat(path)               # a symlink is judged by the folder it points to
    if status.st_uid != os.getuid():
        why = f"owned by uid {status.st_uid}, not by this user (uid {os.getuid()})"
    elif status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        why = f"writable by group or others (mode {stat.S_IMODE(status.st_mode):o})"
    else:
        return path
    raise UnsafeFolder(f"refusing {path}: it is {why}, so another user could change what it "
                       f"holds. Fix: {fix}")
