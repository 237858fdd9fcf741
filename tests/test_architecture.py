"""The folder layout is the architecture (architecture.md §3): every import of every module under
resihp/, function-level ones included, obeys the "may import" table; neither the packages nor the
modules import each other in a cycle; no module is over 400 lines.

The scheduler ranks plans with the evaluator (`resihp.evaluator`: the DAG evaluation of a Program
and its entry with the cost model), which imports only core and cost, so that `sim` (the job
simulator: it runs policies) sits above `sched`.
"""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "resihp"
MAY_IMPORT = {
    "core": set(),
    "cost": {"core"},
    "evaluator": {"core", "cost"},
    "sched": {"core", "cost", "evaluator"},
    "sim": {"core", "cost", "evaluator", "sched"},
    "detect": {"core", "cost", "evaluator", "sim"},
    "model": {"core"},  # the table says torch; its sizes (ModelSpec) are core's
    "runtime": {"core", "cost", "evaluator", "sim", "sched", "detect", "model"},
    "cli": {"core", "cost", "evaluator", "sim", "sched", "detect", "model", "runtime"},
}
MAX_LINES = 400
# Modules over MAX_LINES that another change is splitting (the runtime's sub-packages, issue 12
# item 5); none today. Add "resihp.x.y" here only with the issue that removes it.
LONG_KNOWN: set[str] = set()


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module under resihp/ (a package is its __init__)."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The resihp modules `name` imports anywhere in its body, relative imports resolved; a name
    imported from a package counts as its submodule when one has that name."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in known and t != name)
    return out


def node_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "resihp"


def graph():
    known = modules()
    edges = {m: imports(m, p, known) for m, p in known.items()}
    return known, edges


def test_imports_follow_the_may_import_table():
    """Every import between packages is one the table allows; the package graph is acyclic."""
    known, edges = graph()
    bad, packages = [], {}
    for m, targets in edges.items():
        src = node_of(m)
        for t in targets:
            dst = node_of(t)
            if dst == src:
                continue
            packages.setdefault(src, set()).add(dst)
            if src not in MAY_IMPORT or dst not in MAY_IMPORT[src]:
                bad.append(f"{m} ({src}) imports {t} ({dst})")
    assert not bad, "\n".join(bad)
    assert set(packages) <= set(MAY_IMPORT), set(packages) - set(MAY_IMPORT)
    TopologicalSorter(packages).prepare()  # raises CycleError on a cycle


def test_no_module_import_cycle():
    """No two modules import each other, directly or through others (function-level imports
    included; a submodule's implicit import of its package's __init__ does not count)."""
    _, edges = graph()

    try:
        TopologicalSorter(edges).prepare()
    except CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None


def test_the_walker_sees_function_level_and_relative_imports(tmp_path):
    """The graph is built from every import statement, wherever it is: a cycle hidden in a
    function-level relative import is found."""
    pkg = tmp_path / "resihp" / "p"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n    from resihp.p.a import x\n")
    known = {"resihp.p": pkg / "__init__.py", "resihp.p.a": pkg / "a.py", "resihp.p.b": pkg / "b.py"}
    assert imports("resihp.p.a", pkg / "a.py", known) == {"resihp.p.b"}
    assert imports("resihp.p.b", pkg / "b.py", known) == {"resihp.p.a"}


def test_no_module_is_over_400_lines():
    """Small modules with one idea each (style.md): none over 400 lines."""
    long = {m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert set(long) <= LONG_KNOWN, long
