"""Writing outputs without losing the user's files: what may stand at an output path, and one
atomic write (a unique temporary sibling renamed into place) for every file the tool writes.

Why each rule:
  * a temporary file has a unique name (``mkstemp`` in the target's directory, carrying the
    writer's pid), never a fixed ``.<name>.tmp``: a link planted at a fixed name would redirect
    the write, and two writers of one file would clobber each other's halves;
  * only a regular file (or nothing) at an output path is replaced: a directory, a symbolic
    link, a device (``/dev/full``) or a FIFO is refused, so a rename never swaps a device node or
    a link for a regular file behind the user's back;
  * the result gets the permissions a plain ``open()`` would give (``0666``/``0777`` less the
    umask), not ``mkstemp``'s private ``0600``/``0700``, so that teammates can read shared outputs;
  * a temporary left by a writer that was killed (its pid is gone) is removed by the next write
    of the same name, so killed runs do not pile up hidden files; a directory replaced in two
    renames (``replace_dir``) waits between them under a temporary name of the same pattern, so
    a kill there is undone (the old one put back) rather than hidden.

This module is at the bottom layer (it imports only ``errors``), so that trace, report, regress,
model and runtime can all use it.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

from taxmodel.errors import InputError

TMP_SUFFIX = ".tmp"


def current_umask() -> int:
    """The process's umask (read without changing it where /proc allows, else set and restored)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_mode(directory: bool = False) -> int:
    """What ``open()``/``mkdir()`` would give a new file or directory under the current umask."""
    return (0o777 if directory else 0o666) & ~current_umask()


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def describe(path: str | os.PathLike) -> str | None:
    """What stands at ``path`` (without following a final link): None when nothing does."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    return "a regular file" if stat.S_ISREG(st.st_mode) else _kind(st.st_mode)


def check_parent(path: str | os.PathLike, what: str = "output") -> None:
    """InputError when a directory above ``path`` exists but is not a directory (an output
    "under a regular file"), naming that component."""
    path = Path(path)
    for parent in reversed(path.absolute().parents):  # from the root down; stop at the first missing
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            kind = "a regular file" if stat.S_ISREG(st.st_mode) else _kind(st.st_mode)
            raise InputError(f"{path}: cannot write the {what} there, {parent} is {kind}, not a directory; "
                             "choose another path")


def check_not_input(output: str | os.PathLike, inputs: Iterable[str | os.PathLike], what: str = "output") -> None:
    """InputError when ``output`` is one of ``inputs`` (the same path, or the same file through
    another name: a hard link, a link above it) or lies inside one (an input directory, e.g.
    a bundle: ``--json BASE/b/meta.json`` would replace the baseline it compares against)."""
    hit = overlap(output, inputs)
    if hit:
        where, p = hit
        raise InputError(f"{output}: {where} the input {p}; write the {what} outside what the command reads")


def overlap(path: str | os.PathLike, others: Iterable[str | os.PathLike]) -> tuple[str, Path] | None:
    """("is", other) for the first of ``others`` that ``path`` is (the same path, or the same file
    through another name: a hard link, a link above it), ("is inside", other) for one it lies
    inside; None when there is none."""
    out = Path(path).absolute()
    out_real = Path(os.path.realpath(out))
    try:
        out_id = os.stat(out)[1:3] if os.path.lexists(out) else None  # (ino, dev)
    except OSError:
        out_id = None
    for p in map(Path, others):
        real = Path(os.path.realpath(p.absolute()))
        try:
            same = out_id is not None and os.stat(p)[1:3] == out_id
        except OSError:
            same = False
        if same or out_real == real or real in out_real.parents:
            return ("is" if same or out_real == real else "is inside"), p
    return None


def check_output_file(path: str | os.PathLike, what: str = "output",
                      inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Refuse an output file path at which anything but a regular file (or nothing) stands,
    whose parent is not a directory, or that is (or lies inside) one of the command's
    ``inputs`` (``check_not_input``). Every command that writes a file checks its outputs
    here, before its work. Returns the path."""
    path = Path(path)
    check_parent(path, what)
    check_not_input(path, inputs, what)
    kind = describe(path)
    if kind not in (None, "a regular file"):
        hint = ("remove the link or name the file it points to" if kind == "a symbolic link"
                else "name a file inside it" if kind == "a directory"
                else "write to a regular file, then copy it there if you must")
        raise InputError(f"{path}: is {kind}; taxmodel only replaces regular files ({hint})")
    return path


def make_dirs(path: str | os.PathLike, what: str = "output") -> Path:
    """``mkdir -p`` with the umask's permissions; InputError (not a traceback) when it cannot."""
    path = Path(path)
    check_parent(path / "x", what)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise InputError(f"{path}: exists and is not a directory; choose another path for the {what}") from exc
    except OSError as exc:
        raise InputError(f"{path}: cannot create the directory ({exc.strerror or exc})") from exc
    return path


_STALE = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)-(?P<tag>[A-Za-z0-9_]+)" + re.escape(TMP_SUFFIX) + "$")

OLD_TAG = "OLD"
"""Starts the tag of a directory that ``replace_dir`` moved aside (``.<name>.<pid>-OLD<hex>.tmp``):
the previous version of the target, not a half-written new one. ``mkstemp``/``mkdtemp`` tags
are lower case and digits, so theirs never start with it."""


TEMP_STEM_MAX = 120
"""The longest target name a temporary carries whole: ``.<name>.<pid>-<tag>.tmp`` must stay within
the file system's NAME_MAX (255 bytes) for any legal target name, so longer names are shortened
(``temp_stem``)."""


def temp_stem(name: str) -> str:
    """The target's name as its temporaries carry it: whole when short, else its first bytes, '~'
    and a hash of the whole name (so two long names that share a beginning never share temporaries)."""
    if len(name.encode("utf-8", "surrogateescape")) <= TEMP_STEM_MAX:
        return name
    digest = hashlib.sha1(name.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    head = name.encode("utf-8", "surrogateescape")[:TEMP_STEM_MAX - 13].decode("utf-8", "ignore")
    return f"{head}~{digest}"


def temp_prefix(target: Path) -> str:
    """The prefix of this process's temporaries for ``target``: ``.<name>.<pid>-`` (the name as
    ``temp_stem`` gives it)."""
    return f".{temp_stem(target.name)}.{os.getpid()}-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def clean_stale_temps(target: str | os.PathLike) -> list[Path]:
    """Remove temporaries of ``target`` (``.<name>.<pid>-XXXX.tmp`` beside it) whose writer's pid
    is no longer alive on this host; return what was removed. Others' files are never touched:
    only names of exactly this pattern for exactly this target are considered.

    A previous version that a killed ``replace_dir`` had moved aside (tag ``OLD...``) is put back
    at ``target`` when nothing stands there (the writer died between its two renames: the new
    version never arrived), and removed otherwise (it died after: the new one is in place)."""
    target = Path(target)
    removed: list[Path] = []
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return removed
    olds = []
    for entry in entries:
        m = _STALE.match(entry.name)
        if not m or m.group("name") != temp_stem(target.name) or _pid_alive(int(m.group("pid"))):
            continue
        if m.group("tag").startswith(OLD_TAG) and entry.is_dir(follow_symlinks=False):
            olds.append(Path(entry.path))
        elif _remove(Path(entry.path)):
            removed.append(Path(entry.path))
    for old in sorted(olds, key=lambda p: p.lstat().st_mtime_ns if p.exists() else 0, reverse=True):  # latest first
        if not os.path.lexists(target):
            with contextlib.suppress(OSError):  # not put back: left as it is, never removed
                os.rename(old, target)
        elif _remove(old):
            removed.append(old)
    return removed


def _remove(path: Path) -> bool:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except OSError:
        return False
    return True


def replace_dir(new: str | os.PathLike, target: str | os.PathLike) -> None:
    """Move directory ``new`` to ``target``; an existing ``target`` is swapped out only after
    ``new`` is whole. Between the two renames the old version waits beside it under a temporary
    name of the one stale pattern (tag ``OLD_TAG``): a writer killed there leaves ``target``
    missing for a moment, and the next write of ``target`` (``clean_stale_temps``) or
    ``recover_dir`` puts the old version back; killed after, the old one is removed next time."""
    new, target = Path(new), Path(target)
    if not os.path.lexists(target):
        os.replace(new, target)
        return
    old = target.with_name(f"{temp_prefix(target)}{OLD_TAG}{secrets.token_hex(4)}{TMP_SUFFIX}")
    os.rename(target, old)
    try:
        os.replace(new, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def recover_dir(target: str | os.PathLike) -> bool:
    """Put back a directory that a killed ``replace_dir`` left aside, if ``target`` is missing;
    True when ``target`` exists afterwards. For readers: a bundle is found where the user left it."""
    target = Path(target)
    if not os.path.lexists(target):
        clean_stale_temps(target)
    return os.path.lexists(target)


def make_temp_dir(target: str | os.PathLike) -> Path:
    """A new, unique, empty directory beside ``target`` (same file system: a rename moves it
    into place), with the umask's permissions. Stale temporaries of ``target`` are removed first."""
    target = Path(target)
    clean_stale_temps(target)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(target), suffix=TMP_SUFFIX, dir=target.parent))
    os.chmod(tmp, default_mode(directory=True))
    return tmp


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, what: str = "output",
                inputs: Iterable[str | os.PathLike] = ()) -> Iterator[Path]:
    """Yield a unique temporary path beside ``path``; on success it is renamed onto ``path``,
    on any error it is removed and ``path`` is untouched.

    For writers that want a file name (``savefig``, ``tarfile.open``, ``to_parquet``). The
    target is checked first (``check_output_file``) and again right before the rename."""
    path = check_output_file(path, what, inputs)
    make_dirs(path.parent, what)
    clean_stale_temps(path)
    fd, tmp_name = tempfile.mkstemp(prefix=temp_prefix(path), suffix=TMP_SUFFIX, dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        os.chmod(tmp, default_mode())
        yield tmp
        check_output_file(path, what)  # something may have appeared meanwhile
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: str | os.PathLike, data: str | bytes, *, encoding: str = "utf-8",
                 what: str = "output", inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Write ``data`` (text or bytes) to ``path`` atomically; return the path.

    InputError when ``path`` is not a regular file (see the module docstring) or cannot be
    written (no space, no permission): one line naming the path."""
    path = Path(path)
    try:
        with atomic_path(path, what, inputs) as tmp:
            if isinstance(data, bytes):
                tmp.write_bytes(data)
            else:
                tmp.write_text(data, encoding=encoding)
    except InputError:
        raise
    except OSError as exc:
        raise InputError(f"{path}: cannot write the {what} ({exc.strerror or exc})") from exc
    return path


LOCK_WAIT_S = 600.0
"""How long a writer waits for another one holding the lock (``directory_lock``) before it gives up."""


@contextlib.contextmanager
def directory_lock(target: str | os.PathLike, what: str = "update", wait_s: float | None = None) -> Iterator[None]:
    """Hold an exclusive lock for writing ``target`` (read, decide, write: one writer at a time).

    The lock is an ``flock`` on the directory that holds ``target``: it survives ``target``
    being replaced by a rename (a lock on ``target`` itself would lock the old inode), leaves no
    file behind, and is released by the kernel when its holder dies (a killed writer never
    blocks the next one). A second writer waits up to ``wait_s`` (``LOCK_WAIT_S``) and then
    stops with one line. Where ``flock`` does not exist the lock is a no-op."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    import time

    target = Path(target)
    parent = make_dirs(target.absolute().parent, what)
    fd = os.open(parent, os.O_RDONLY)
    try:
        deadline = time.monotonic() + (LOCK_WAIT_S if wait_s is None else wait_s)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise InputError(f"{target}: another {what} of it (or of a sibling in {parent}) is still running; "
                                     "try again when it has finished") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock
