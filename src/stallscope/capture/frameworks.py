"""Who built a DataLoader: the user's own line, and the framework in between.

Under Hugging Face `Trainer`, Lightning or accelerate the line that calls `DataLoader(...)` is
the framework's (`transformers/trainer.py`, `accelerate/data_loader.py`, Lightning's wrapper of
`__init__`), and a recommendation pointing there cannot be pasted: the user's knob is
`TrainingArguments(dataloader_num_workers=...)`, the `DataLoader(...)` in their
`train_dataloader()`, or the loader they passed to `accelerator.prepare`. At construction the
stack says all of it, so the watcher (capture/loaders.py) asks `origin()` once per loader:

- the user's own frame: the first one outside torch, the frameworks, stallscope, the standard
  library and installed packages (a script whose code is itself installed falls back to the
  first frame outside torch, the frameworks and stallscope);
- the framework: `transformers.Trainer`, `lightning` or `accelerate`, from the modules on the
  stack (Trainer runs on accelerate, so it wins over it);
- a loader rebuilt from another one (accelerate's `prepare_data_loader` always builds a new
  `DataLoader` inside a `DataLoaderShard`; Lightning re-instantiates for distributed samplers):
  the earlier, registered loader held by a framework frame's locals, whose origin it inherits;
- for a loader `Trainer` built from its `TrainingArguments`: where the script built those,
  kept by `ArgumentsWatch`, which wraps `TrainingArguments.__post_init__` once transformers'
  `training_args` module is imported (never importing it for a script that does not).

Plain stack inspection: no framework is imported here.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import os
import site
import sys
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

# Top-level packages whose frames are never the user's line.
TORCH = ("torch",)
FRAMEWORKS = {
    "transformers": "transformers.Trainer",
    "lightning": "lightning",
    "pytorch_lightning": "lightning",
    "lightning_fabric": "lightning",
    "accelerate": "accelerate",
}
# The frameworks that rebuild a DataLoader from one built before (accelerate's
# prepare_data_loader and skip_first_batches, Lightning's re-instantiation with a sampler).
REBUILDERS = ("accelerate", "lightning", "pytorch_lightning", "lightning_fabric")
OTHER_LIBRARIES = ("lightning_utilities", "datasets", "stallscope")
# The order a stack's frameworks are named in: Trainer builds on accelerate.
PRECEDENCE = ("transformers.Trainer", "lightning", "accelerate")
TRAINING_ARGS_MODULE = "transformers.training_args"
_SITE_ATTR = "_stallscope_site"
_STALLSCOPE_DIR = str(Path(__file__).resolve().parent.parent)


@dataclass(frozen=True)
class Origin:
    """Where a DataLoader came from, as `LoaderInfo` records it (stallscope/runfacts.py)."""

    call_site: str  # the user's own frame, "train.py:42"; "unknown" when the stack has none
    user_site: str | None = None  # the same frame with its function: "train.py:42 in main"
    framework: str | None = None  # transformers.Trainer, lightning, accelerate; None: none
    configured_in: str = "DataLoader"  # the call whose arguments set this loader
    settings_site: str | None = None  # where that call is, when known
    built_at: str | None = None  # the framework's line that called DataLoader(...), if not ours
    parent: Any = None  # the registered DataLoader this one was rebuilt from


def origin(loader: Any, frame: FrameType | None,
           registered: Callable[[Any], Any | None]) -> Origin:
    """The origin of `loader`, whose `__init__` was called from `frame`.

    `registered(obj)` returns the watcher's record of a DataLoader built earlier (None for
    anything else): a framework frame holding one is rebuilding it, and the new loader keeps
    the original's call site, framework and settings.
    """
    first_outside: FrameType | None = None  # the old call site: first frame outside torch
    fallback: FrameType | None = None  # first frame outside the known packages
    user: FrameType | None = None
    seen: set[str] = set()
    parent = None
    args_site: str | None = None
    f = frame
    while f is not None:
        if first_outside is None and _holds(f, loader):
            # Part of the construction: a DataLoader subclass's own `__init__`, or a wrapper
            # of it (Lightning wraps `__init__` to record the arguments).
            f = f.f_back
            continue
        package = _package(f)
        filename = f.f_code.co_filename
        if package in FRAMEWORKS:
            seen.add(FRAMEWORKS[package])
            if user is None and parent is None and package in REBUILDERS:
                parent = _rebuilt_from(f, loader, registered)
            if args_site is None and package == "transformers":
                args_site = _arguments_site(f)
        internal = package in TORCH or package == "stallscope" or filename.startswith(
            (_STALLSCOPE_DIR, "<"))
        if not internal and first_outside is None:
            first_outside = f
        known = internal or package in FRAMEWORKS or package in OTHER_LIBRARIES
        if not known and fallback is None:
            fallback = f
        if not known and user is None and not _library_file(filename):
            user = f
        f = f.f_back
    mine = user or fallback or first_outside
    call_site = _site(mine) if mine is not None else "unknown"
    built_at = None
    if first_outside is not None and first_outside is not mine:
        built_at = _site(first_outside, short=True)
    parent_info = registered(parent) if parent is not None else None
    if parent_info is not None:
        # A rebuild: what the user wrote is the original's; the framework may be new (a plain
        # loader handed to accelerate.prepare).
        return Origin(
            call_site=parent_info.call_site,
            user_site=parent_info.user_site,
            framework=parent_info.framework or _name(seen),
            configured_in=parent_info.configured_in,
            settings_site=parent_info.settings_site,
            built_at=built_at,
            parent=parent,
        )
    framework = _name(seen)
    direct = first_outside is mine  # the user's own line calls DataLoader(...)
    if framework == "transformers.Trainer" and not direct:
        return Origin(call_site, _function_site(mine), framework, "TrainingArguments",
                      args_site, built_at)
    return Origin(call_site, _function_site(mine), framework, "DataLoader", call_site, built_at)


def _name(seen: set[str]) -> str | None:
    return next((name for name in PRECEDENCE if name in seen), None)


def _package(frame: FrameType) -> str:
    name = frame.f_globals.get("__name__")
    return name.partition(".")[0] if isinstance(name, str) else ""


def _holds(frame: FrameType, loader: Any) -> bool:
    """Whether the frame has the loader under construction among its locals."""
    try:
        return any(value is loader for value in frame.f_locals.values())
    except Exception:
        return False


def _local(frame: FrameType, name: str) -> Any:
    try:
        return frame.f_locals.get(name)
    except Exception:  # a frame whose locals cannot be read is nobody's constructor
        return None


def _rebuilt_from(frame: FrameType, loader: Any,
                  registered: Callable[[Any], Any | None]) -> Any:
    """A registered DataLoader among a framework frame's locals: the one being rebuilt."""
    try:
        values = list(frame.f_locals.values())
    except Exception:
        return None
    for value in values:
        if value is not loader and registered(value) is not None:
            return value
    return None


def _arguments_site(frame: FrameType) -> str | None:
    """Where the script built the TrainingArguments of the Trainer running in `frame`."""
    owner = _local(frame, "self")
    args = getattr(owner, "args", None) if owner is not None else None
    site_text = getattr(args, "__dict__", {}).get(_SITE_ATTR) if args is not None else None
    return site_text if isinstance(site_text, str) else None


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    """The standard library and every installed-packages folder, each ending in a separator."""
    paths = sysconfig.get_paths()
    dirs = [paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    with contextlib.suppress(AttributeError):  # some virtualenvs' site module lacks them
        dirs += list(site.getsitepackages())
    with contextlib.suppress(AttributeError):
        dirs.append(site.getusersitepackages())
    out = set()
    for d in dirs:
        if d:
            out.add(os.path.join(os.path.realpath(d), ""))
            out.add(os.path.join(os.path.abspath(d), ""))
    return tuple(sorted(out))


@functools.lru_cache(maxsize=512)
def _library_file(filename: str) -> bool:
    if filename.startswith("<"):
        return True
    path = os.path.abspath(filename)
    return path.startswith(_library_dirs()) or os.path.realpath(path).startswith(_library_dirs())


def _site(frame: FrameType, short: bool = False) -> str:
    """`train.py:42`; with `short`, an installed package's file from its package folder
    (`transformers/trainer.py:1051`) rather than the whole site-packages path."""
    filename = frame.f_code.co_filename
    path = display_path(filename)
    if short and _library_file(filename):
        full = os.path.abspath(filename)
        base = max((d for d in _library_dirs() if full.startswith(d)), key=len, default="")
        path = full[len(base):] if base else path
    return f"{path}:{frame.f_lineno}"


def _function_site(frame: FrameType | None) -> str | None:
    if frame is None:
        return None
    code = frame.f_code
    name = getattr(code, "co_qualname", code.co_name)
    return f"{_site(frame)} in {name}"


def display_path(filename: str) -> str:
    """A path relative to the working folder when inside it, else as it is."""
    path = Path(filename)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


def user_frame_site(frame: FrameType | None) -> str | None:
    """The first frame from `frame` outward that is the user's: "train.py:30"."""
    fallback = None
    f = frame
    while f is not None:
        package = _package(f)
        filename = f.f_code.co_filename
        known = (package in TORCH or package in FRAMEWORKS or package in OTHER_LIBRARIES
                 or filename.startswith((_STALLSCOPE_DIR, "<")))
        if not known:
            if not _library_file(filename):
                return _site(f)
            fallback = fallback or f
        f = f.f_back
    return _site(fallback) if fallback is not None else None


# ------------------------------------------------------------------ TrainingArguments' site


class ArgumentsWatch:
    """Keeps, on each `TrainingArguments` the script builds, the user's line that built it.

    Installed for the run and removed after. transformers is patched only if the script
    imports it: at once when its `training_args` module is already loaded, else by a finder at
    the front of `sys.meta_path` that lets the normal finder load the module and wraps it just
    after. `__post_init__` is what every TrainingArguments subclass's generated `__init__` ends
    in, so subclasses are covered too.
    """

    def __init__(self) -> None:
        self._finder: _AfterImport | None = None
        # transformers' TrainingArguments (found at run time) and its own __post_init__
        self._patched: tuple[Any, Any] | None = None

    def install(self) -> None:
        module = sys.modules.get(TRAINING_ARGS_MODULE)
        if module is not None:
            self._patch(module)
            return
        self._finder = _AfterImport(TRAINING_ARGS_MODULE, self._patch)
        sys.meta_path.insert(0, self._finder)

    def uninstall(self) -> None:
        if self._finder is not None:
            if self._finder in sys.meta_path:
                sys.meta_path.remove(self._finder)
            self._finder = None
        if self._patched is not None:
            cls, orig = self._patched
            cls.__post_init__ = orig
            self._patched = None

    def _patch(self, module: ModuleType) -> None:
        cls = getattr(module, "TrainingArguments", None)
        orig = getattr(cls, "__post_init__", None) if cls is not None else None
        if cls is None or orig is None or self._patched is not None:
            return

        @functools.wraps(orig)
        def __post_init__(args: Any, *a: Any, **k: Any) -> Any:  # noqa: N807
            if _SITE_ATTR not in args.__dict__:
                # the site is lost, never the script's arguments
                with contextlib.suppress(Exception):
                    object.__setattr__(args, _SITE_ATTR, user_frame_site(sys._getframe(1)))
            return orig(args, *a, **k)

        cls.__post_init__ = __post_init__
        self._patched = (cls, orig)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls `then(module)` right after the module `name` is executed by its normal loader."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.then = then

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return None  # let the other finders do as without us
        orig, then = loader.exec_module, self.then

        def exec_module(module: ModuleType) -> None:
            orig(module)
            with contextlib.suppress(Exception):  # the site is lost, never the import
                then(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
