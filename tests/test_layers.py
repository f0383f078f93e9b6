"""The package layout is the pipeline (docs/architecture.md), and imports flow one way through it.

    commands -> report -> diagnose -> replay -> trace      capture beside trace
    (cli and the Python API above all, side by side; errors, progress, outputs, fanout, text,
    units, the run facts, the step marker and the heap trim below all)

`replay` and `diagnose` may not import `capture` even though it sits lower: they read what a
recording knows about its run from the run facts and the trace stage, never from the code that
runs inside the training process (docs/architecture.md, "The pipeline").

Every import of a stallscope module is read with `ast`, function-level (lazy) imports included,
since a lazy import is how an upward dependency usually hides. A lower layer importing a higher
one, two rooms of one layer importing each other, an import circle, anything importing `cli`,
or torch/jinja2 outside the stage that owns it fails here, with the offending line named.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "src" / "stallscope"

# Layers, lowest first, each a set of rooms (room name -> the modules or packages in it). A module
# may import its own room and any lower layer; rooms that share a layer (trace and capture) are
# independent of each other.
LAYERS: list[dict[str, tuple[str, ...]]] = [
    {"base": ("stallscope", "stallscope.errors", "stallscope.text", "stallscope.units",
              "stallscope.progress", "stallscope.outputs", "stallscope.fanout",
              "stallscope.marker", "stallscope.runfacts", "stallscope.heap",
              "stallscope.loadrule")},
    {"trace": ("stallscope.trace",), "capture": ("stallscope.capture",),
     "wholerun": ("stallscope.wholerun",)},
    {"replay": ("stallscope.replay",)},
    {"diagnose": ("stallscope.diagnose",)},
    {"report": ("stallscope.report",)},
    {"commands": ("stallscope.commands",)},
    {"front door": ("stallscope.cli", "stallscope.__main__"),
     "api": ("stallscope.api", "stallscope.integrations")},
]
# Rooms that may not import another room although it sits lower: (importer, imported) -> why.
APART = {
    ("replay", "capture"): "replay reads run facts from stallscope.runfacts and the trace stage "
                           "(trace/otherload.py), never from capture",
    ("diagnose", "capture"): "the rules read run facts from stallscope.runfacts and the trace "
                             "stage (trace/otherload.py), never from capture",
}
# The package root offers the Python API (`stallscope.analyze`, `.profile`, `.Report`) through
# a lazy module `__getattr__` (PEP 562): `import stallscope` loads none of it, and every stage
# may still import the root for `__version__`. That one edge, from the root to the API and
# only inside a function or an `if TYPE_CHECKING:` block, is the facade, not a dependency.
FACADE = {("stallscope", "stallscope.api")}
# Third-party packages only one stage may load at module level (docs/architecture.md: only the
# capture imports torch, so `analyze` starts fast without CUDA; the trace and rules never render
# HTML).
OWNED = {"torch": "stallscope.capture", "jinja2": "stallscope.report"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> dict[str, str]:
    return {module_name(p): p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")}


def room(module: str) -> tuple[int, str] | None:
    """(layer, room name) of a module; the package root `stallscope` matches only itself."""
    for level, rooms in enumerate(LAYERS):
        for name, members in rooms.items():
            if any(module == m or (m != "stallscope" and module.startswith(m + "."))
                   for m in members):
                return level, name
    return None


def imports(module: str, source: str, known: set[str]) -> list[tuple[str, int, bool]]:
    """(imported stallscope module, line, at module level) for every import in `source`;
    `known` names every module, so `from pkg import name` can tell a module from an attribute."""
    tree = ast.parse(source)
    top = {id(n) for n in tree.body}
    packages = {m.rpartition(".")[0] for m in known}
    package = module if module in packages else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from stallscope import progress` imports the module stallscope.progress.
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                     for a in node.names]
        for name in dict.fromkeys(names):
            if name == "stallscope" or name.startswith("stallscope.") or \
                    name.split(".")[0] in OWNED:
                found.append((name, node.lineno, id(node) in top))
    return found


def violations(modules: dict[str, str]) -> list[str]:
    """Every broken layering rule in `modules` (name -> source), one line each."""
    known = set(modules)
    problems: list[str] = []
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, source in sorted(modules.items()):
        mine = room(module)
        if mine is None:
            problems.append(f"{module}: in no layer; add its room to LAYERS")
        for name, line, top in imports(module, source, known):
            where = f"{module}:{line} imports {name}"
            owner = OWNED.get(name.split(".")[0])
            if owner is not None:
                if top and not (module == owner or module.startswith(owner + ".")):
                    problems.append(f"{where}: only {owner} may import it at module level")
                continue
            if (module, name) in FACADE and not top:
                continue
            graph[module].add(name)
            if name == "stallscope.cli" and module != "stallscope.__main__":
                problems.append(f"{where}: nothing imports the CLI")
            theirs = room(name)
            if mine is None or theirs is None or theirs[1] == mine[1]:
                continue
            if (mine[1], theirs[1]) in APART:
                problems.append(f"{where}: {APART[mine[1], theirs[1]]}")
            elif theirs[0] > mine[0]:
                problems.append(f"{where}: upward, from {mine[1]} to {theirs[1]}")
            elif theirs[0] == mine[0]:
                problems.append(f"{where}: {mine[1]} and {theirs[1]} stand side by side and "
                                "must not depend on each other")
    problems += [f"import circle: {' -> '.join(c)}" for c in circles(graph)]
    return problems


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One closed path per strongly connected group of modules (Tarjan), as module names."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph.get(v, ()):
                groups.append(sorted(group) + [sorted(group)[0]])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_the_package_keeps_its_layers() -> None:
    assert violations(sources()) == []


def test_replay_and_diagnose_never_import_capture() -> None:
    """What a recording knows about its run reaches them as data (docs/architecture.md), so an
    analysis never depends on the code that runs inside the training process."""
    found = [p for p in violations(sources()) if p.endswith("never from capture")]
    assert found == [], "\n".join(found)


RULES_PACKAGE = "stallscope.diagnose.rules"


def rule_borrowings(modules: dict[str, str]) -> list[str]:
    """Every import of one rule module by another (diagnose/rules/): what rules share lives in
    diagnose/common.py, and a rule reads another's finding from the diagnosis, never runs it."""
    known = set(modules)
    found = []
    for module, source in sorted(modules.items()):
        if not module.startswith(RULES_PACKAGE + "."):
            continue
        for name, line, _ in imports(module, source, known):
            if name.startswith(RULES_PACKAGE + ".") and name != module:
                found.append(f"{module}:{line} imports {name}: a rule never imports another")
    return found


def test_no_rule_imports_another_rule() -> None:
    modules = sources()
    from stallscope.diagnose.registry import ALL_RULES

    assert sum(m.startswith(RULES_PACKAGE + ".") for m in modules) == len(ALL_RULES)
    assert rule_borrowings(modules) == []


def test_a_planted_rule_borrowing_is_caught() -> None:
    modules = sources()
    planted = "from stallscope.diagnose.rules.dataloader_bound import dataloader_bound\n"
    name = RULES_PACKAGE + ".cpu_oversubscription"
    modules[name] = planted + modules[name]
    assert rule_borrowings(modules) == [
        f"{name}:1 imports {RULES_PACKAGE}.dataloader_bound: a rule never imports another"]


def test_every_module_says_what_it_is_for() -> None:
    missing = [m for m, s in sources().items() if not (ast.get_docstring(ast.parse(s)) or "")]
    assert missing == []


@pytest.mark.parametrize(
    ("module", "planted", "expected"),
    [
        # the model reaching up into a command
        ("stallscope.trace.model", "from stallscope.commands.run import Launch\n",
         "upward, from trace to commands"),
        # a lazy import inside a function counts too
        ("stallscope.diagnose.rules.host_device_sync",
         "def f():\n    from stallscope.report import Report\n",
         "upward, from diagnose to report"),
        ("stallscope.capture.steps", "from stallscope.trace.load import Trace\n",
         "stand side by side"),
        ("stallscope.commands.tune", "from stallscope.cli import main\n",
         "nothing imports the CLI"),
        ("stallscope.diagnose.rules.gpu_idle", "import torch\n",
         "only stallscope.capture may import"),
        ("stallscope.trace.load", "import jinja2\n", "only stallscope.report may import"),
        ("stallscope.trace.model", "from stallscope.trace import load\n", None),  # allowed
        # capture sits lower, yet replay and diagnose read run facts, never the capture
        ("stallscope.replay.loader", "from stallscope.capture.hostload import sample\n",
         "replay reads run facts from stallscope.runfacts"),
        ("stallscope.diagnose.plan", "def f():\n    from stallscope.capture import steady\n",
         "the rules read run facts from stallscope.runfacts"),
        ("stallscope.diagnose", "import stallscope.capture.runner\n",
         "never from capture"),
        # the report may still read capture's definitions (tune's --set arguments)
        ("stallscope.report.build", "from stallscope.capture.overrides import label\n", None),
        # the root's facade must stay lazy: at module level it would load the whole pipeline
        ("stallscope", "from stallscope.api import analyze\n", "upward, from base to api"),
        ("stallscope.capture.session", "from stallscope.api import Report\n",
         "upward, from capture to api"),
        ("stallscope.commands.run", "from stallscope.integrations import lightning\n",
         "upward, from commands to api"),
    ],
)
def test_a_planted_import_is_caught(module: str, planted: str, expected: str | None) -> None:
    modules = sources()
    modules[module] = planted + modules[module]
    found = violations(modules)
    if expected is None:
        assert found == []
    else:
        assert any(module in p and expected in p for p in found), found


def test_a_planted_circle_is_caught() -> None:
    modules = sources()
    # trace.load already imports trace.decode; the reverse closes a circle inside one room.
    lazy = "def f():\n    from stallscope.trace.load import Trace\n"
    modules["stallscope.trace.decode"] = lazy + modules["stallscope.trace.decode"]
    found = violations(modules)
    assert any(f.startswith("import circle: stallscope.trace.decode -> stallscope.trace.load ->")
               and f.endswith("-> stallscope.trace.decode") for f in found), found


def test_a_module_outside_the_layers_is_named() -> None:
    modules = {**sources(), "stallscope.misc": '"""Loose."""\n'}
    assert "stallscope.misc: in no layer; add its room to LAYERS" in violations(modules)
