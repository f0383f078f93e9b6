"""Where reports go: a fresh folder, files written atomically, nothing overwritten by surprise."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from stallscope.errors import OutputError

REPORT_FILES = ("report.json", "report.html", "report.md")


def default_out_dir(inputs: list[Path]) -> Path:
    """`./stallscope-<name of the first input>` in the current folder (inputs may be read-only)."""
    name = inputs[0].resolve().name or "trace"
    for suffix in (".gz", ".json", ".pt.trace"):
        name = name.removesuffix(suffix)
    return Path.cwd() / f"stallscope-{name}"


def default_run_out_dir(stem: str) -> Path:
    """`./stallscope-<script stem>` for `stallscope run`."""
    return Path.cwd() / f"stallscope-{stem}"


def prepare_out_dir(out: Path, force: bool, files: tuple[str, ...] = REPORT_FILES) -> None:
    """Refuse, before any expensive work, to overwrite `files` in `out` without --force."""
    existing = [f for f in files if (out / f).exists()]
    if existing and not force:
        raise OutputError(
            f"{out} already holds {', '.join(existing)}; use --force to overwrite or -o for "
            "another folder"
        )
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create {out}: {exc.strerror or exc}") from None


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary file beside `path`, then rename: a reader never sees half a file."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
