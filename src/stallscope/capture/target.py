"""Run the user's script or module exactly as `python SCRIPT ARGS` / `python -m MODULE ARGS` would.

The script sees the same `__name__`, `sys.argv`, `sys.path[0]` and working folder as under plain
python; all of it is restored afterwards so stallscope can go on to analyse in the same process.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path

from stallscope.errors import InputError


@dataclass(frozen=True)
class Target:
    """What to run: a script path (as typed) or a module name, and its arguments."""

    name: str
    args: tuple[str, ...]
    is_module: bool

    @property
    def stem(self) -> str:
        """A short name for output folders: `train` for train.py or pkg.train."""
        if self.is_module:
            return self.name.rsplit(".", 1)[-1]
        path = Path(self.name)
        return (path.stem if path.suffix else path.name) or "script"


def check_target(target: Target) -> None:
    """Refuse, before anything runs, a script or module that does not exist (exit 2)."""
    if not target.is_module:
        path = Path(target.name)
        if path.is_dir():
            if not (path / "__main__.py").is_file():
                raise InputError(f"{target.name} is a folder without __main__.py")
        elif not path.is_file():
            raise InputError(f"no such script: {target.name}")
        return
    saved = sys.path[0]
    sys.path[0] = os.getcwd()
    try:
        spec = importlib.util.find_spec(target.name)
    except ModuleNotFoundError:
        spec = None
    except Exception:  # the package itself fails to import: that is the script's error to show
        return
    finally:
        sys.path[0] = saved
    if spec is None:
        raise InputError(f"no module named {target.name}")


def run_target(target: Target) -> None:
    """Execute the target in this process; exceptions (SystemExit included) propagate."""
    saved_argv, saved_path0, saved_cwd = sys.argv[:], sys.path[0], os.getcwd()
    try:
        if target.is_module:
            sys.argv = [target.name, *target.args]  # runpy puts the module's file in argv[0]
            sys.path[0] = os.getcwd()
            runpy.run_module(target.name, run_name="__main__", alter_sys=True)
        else:
            path = os.path.abspath(target.name)
            sys.argv = [target.name, *target.args]
            sys.path[0] = path if os.path.isdir(path) else os.path.dirname(path)
            runpy.run_path(path, run_name="__main__")
    finally:
        sys.argv = saved_argv
        sys.path[0] = saved_path0
        with contextlib.suppress(OSError):
            os.chdir(saved_cwd)
