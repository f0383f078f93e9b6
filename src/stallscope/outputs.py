"""Where reports go: a fresh folder, files written atomically, nothing overwritten by surprise.

A report is a set of files (report.json, .html, .md) that must agree: they are written as a set,
each to a temporary file first and renamed into place only once all of them were written whole.
A full disk or an unwritable folder therefore leaves the previous report as it was (or no report),
never a new report.json beside an old report.html, and never half a file.
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock; folders are then not locked
    fcntl = None  # type: ignore[assignment]

from stallscope.errors import OutputError, os_error_text

REPORT_FILES = ("report.json", "report.html", "report.md")
# Characters kept from an input's name in the default output folder's name: a file name from
# someone else's machine may hold escape sequences, markup or bidirectional overrides.
_UNSAFE_NAME = re.compile(r"[^\w.+-]+")
_MAX_NAME = 100
# Output folders this process holds locked (resolved path -> open descriptor of the folder),
# held until the command ends (`release_out_dirs`) or the process does: a second
# `analyze`/`run` writing the same folder at once is refused instead of silently replacing one
# report with the other.
_LOCKS: dict[str, int] = {}
# Folders prepare_out_dir created in this command, deepest first: those still empty when the
# command fails (a typo in an input) are removed again (`remove_empty_made_dirs`).
_MADE: list[Path] = []


def default_out_dir(inputs: list[Path]) -> Path:
    """`./stallscope-<name of the first input>` in the current folder (inputs may be read-only)."""
    name = inputs[0].resolve().name or "trace"
    for suffix in (".gz", ".json", ".pt.trace"):
        name = name.removesuffix(suffix)
    name = _UNSAFE_NAME.sub("_", name).strip("._")[:_MAX_NAME] or "trace"
    return Path.cwd() / f"stallscope-{name}"


def default_run_out_dir(stem: str) -> Path:
    """`./stallscope-<script stem>` for `stallscope run`."""
    return Path.cwd() / f"stallscope-{stem}"


def prepare_out_dir(out: Path, force: bool, files: tuple[str, ...] = REPORT_FILES,
                    lock: bool = True) -> None:
    """Refuse, before any expensive work, to overwrite `files` in `out` without --force, and
    to write where writing will fail: `out` is created and a file is created and removed in it.
    With `lock`, the folder is then held for this process (see lock_out_dir)."""
    _check_links(out)
    existing = [f for f in files if os.path.lexists(out / f)]
    if existing and not force:
        raise OutputError(
            f"{out} already holds {', '.join(existing)}; use --force to overwrite or -o for "
            "another folder"
        )
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} exists and is not a folder")
    for f in existing:
        # A symlink is replaced itself (os.replace never follows it), and only with --force.
        if not (out / f).is_symlink() and not (out / f).is_file():
            raise OutputError(f"{out / f} exists and is not a file; remove it or use -o")
    missing = [d for d in (out, *out.parents) if not os.path.lexists(d)]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create {out}: {os_error_text(exc)}") from None
    _MADE.extend(d for d in missing if d not in _MADE)
    try:
        with tempfile.TemporaryFile(dir=out, prefix=".stallscope-probe-"):
            pass
    except OSError as exc:
        raise OutputError(f"cannot write in {out}: {os_error_text(exc)}") from None
    if lock:
        lock_out_dir(out)


def _check_links(out: Path) -> None:
    """A symlink on the way to `out` that someone else could have planted (owned by another
    user, or in a folder others may write, such as /tmp) is refused: followed, it would send
    this user's report (and the rights of this process) wherever its maker chose. A link of the
    user's own or root's, in a folder only they write, is followed, and where it leads is
    said (a warning line)."""
    for link in [d for d in (out, *out.parents) if d.is_symlink()][::-1]:
        try:
            own, holder = link.lstat(), link.parent.stat()
        except OSError:
            continue
        trusted = (os.getuid(), 0)  # this user, or root's (macOS's /tmp -> /private/tmp)
        shared = holder.st_mode & 0o022 != 0 or holder.st_uid not in trusted
        if own.st_uid not in trusted or shared:
            who = "another user's" if own.st_uid not in trusted else "in a folder others write"
            raise OutputError(f"-o {out}: {link} is a symlink ({who}) to {os.readlink(link)}; "
                              "refused, since anyone who can write there chooses where the "
                              "report goes; give the real folder")
    if out.resolve() != out.absolute():
        from stallscope import progress

        progress.warn(f"-o {out} leads through a symlink: writing to {out.resolve()}")


def lock_out_dir(out: Path) -> None:
    """Hold an exclusive lock on the folder itself (flock on its descriptor: no lock file to
    leave behind) until the command or the process ends; another process holding it is exit
    2."""
    key = str(out.resolve())
    if key in _LOCKS or fcntl is None:
        return
    try:
        fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise OutputError(f"cannot open {out}: {os_error_text(exc)}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return  # a file system without locks (some network mounts): write unlocked
        raise OutputError(f"{out} is being written by another stallscope process; wait for it "
                          "to finish or use -o for another folder") from None
    _LOCKS[key] = fd


def release_out_dirs() -> None:
    """Unlock every folder this process locked: the command that wrote them has finished (a
    process that calls `stallscope.cli.main` again, or a notebook, may write there next)."""
    while _LOCKS:
        _, fd = _LOCKS.popitem()
        os.close(fd)  # closing the descriptor releases its flock


def remove_empty_made_dirs(remove: bool) -> None:
    """Forget the folders this command created; with `remove` (the command failed), remove
    those still empty first, so that a refused input leaves no empty `./stallscope-<name>/`.
    A folder that holds anything (an earlier report, a trace) is kept."""
    made = sorted(_MADE, key=lambda d: len(d.parts), reverse=True)
    _MADE.clear()
    for folder in made if remove else []:
        try:
            folder.rmdir()  # only an empty folder; a symlink is not one
        except OSError:
            continue


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary file beside `path`, then rename: a reader never sees half a file."""
    write_files(path.parent, {path.name: text})


def write_files(out: Path, files: dict[str, str]) -> None:
    """Write every file of `files` (name -> text) into `out`, all or none: each is written whole
    to a temporary file first; only when all are written are they renamed into place. On any
    error the temporary files are removed and the folder holds what it held before."""
    staged: list[tuple[str, Path]] = []
    try:
        try:
            for name, text in files.items():
                staged.append((name, _stage(out / name, text)))
        except OSError as exc:
            failed = out / list(files)[len(staged)]
            raise OutputError(f"cannot write {failed}: {os_error_text(exc)}") from None
        for i, (name, tmp) in enumerate(staged):
            try:
                os.replace(tmp, out / name)
            except OSError as exc:
                raise OutputError(f"cannot write {out / name}: {os_error_text(exc)}") from None
            staged[i] = (name, out / name)  # in place: no longer a temporary file to remove
    finally:
        for name, tmp in staged:
            if tmp != out / name:
                tmp.unlink(missing_ok=True)


def _stage(path: Path, text: str) -> Path:
    """`text` written whole to a new temporary file beside `path`, with the permissions a plain
    new file would get (mkstemp's are owner-only); its path."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        # Writers clean names for display; `replace` is the last guard, so a file name with
        # bytes that are not UTF-8 can never cost the whole report.
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as fh:
            os.fchmod(fh.fileno(), _file_mode(path))
            fh.write(text)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _file_mode(path: Path) -> int:
    """The mode of the file being replaced, else 0o666 less the umask."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
