"""Run the user's script or module exactly as `python SCRIPT ARGS` / `python -m MODULE ARGS` would.

The script sees the same `__name__`, `sys.argv`, `sys.path[0]` and working folder as under plain
python; all of it is restored afterwards so stallscope can go on to analyse in the same process.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib.machinery
import importlib.util
import os
import runpy
import sys
import types
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


def _run_script(path: str) -> None:
    """As python runs a script file: argv[0] as typed, an absolute `__file__`, no `__spec__`,
    and the script's module installed as `__main__` so pickling its classes works."""
    with open(path, "rb") as fh:
        source = fh.read()
    code = compile(source, path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=path,
        __builtins__=builtins,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
        __cached__=None,
    )
    sys.path[0] = os.path.dirname(path)
    saved_main = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        if saved_main is not None:
            sys.modules["__main__"] = saved_main


def run_target(target: Target) -> None:
    """Execute the target in this process; exceptions (SystemExit included) propagate."""
    saved_argv, saved_path0, saved_cwd = sys.argv[:], sys.path[0], os.getcwd()
    try:
        if target.is_module:
            sys.argv = [target.name, *target.args]  # runpy puts the module's file in argv[0]
            sys.path[0] = os.getcwd()
            runpy.run_module(target.name, run_name="__main__", alter_sys=True)
        elif os.path.isdir(target.name):
            sys.argv = [target.name, *target.args]
            sys.path[0] = os.path.abspath(target.name)
            runpy.run_path(target.name, run_name="__main__")
        else:
            sys.argv = [target.name, *target.args]
            _run_script(os.path.abspath(target.name))
    finally:
        sys.argv = saved_argv
        sys.path[0] = saved_path0
        with contextlib.suppress(OSError):
            os.chdir(saved_cwd)
