"""The runtime's layout: sub-packages in layers, no import cycle, small modules, torch only where needed.

Imports are read from the source (`ast`), function-level ones included, so a cycle hidden behind a
late import counts too.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import resihp

ROOT = Path(resihp.__file__).parent
RUNTIME = ROOT / "runtime"

# Each module may import modules of its own layer or a lower one (docs/runtime.md, "Layout").
LAYERS = {
    "job": 0,
    "faults": 0,
    "exec": 1,
    "state": 2,
    "adapt": 3,
    "control": 4,
    "checks": 5,
    "config": 5,
    "train": 5,
    "live": 5,
    "reference": 5,  # the tests' oracle: nothing in the package imports it
}
TORCH_FREE = [
    "job", "faults", "checks", "config", "control.protocol", "control.transport", "control.liveness",
    "control.pids", "control.agent", "control.processes", "control.boundaries", "adapt.reconfig",
    "adapt.slowwatch", "adapt.calibrate", "state.dirlock", "control.signals", "control.events",
    "control.failover", "exec.p2p", "control.hosting", "control.remote", "control.serve",
]  # fmt: skip


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every resihp module `path` imports, anywhere in it (absolute names)."""
    mod = _module(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            out.add(name)
            for alias in node.names:  # `from package import submodule`
                sub = f"{name}.{alias.name}"
                if (ROOT.parent / sub.replace(".", "/")).with_suffix(".py").exists():
                    out.add(sub)
    return {m for m in out if m.startswith("resihp.")}


def _graph() -> dict[str, set[str]]:
    return {
        _module(p): {m for m in _imports(p) if m.startswith("resihp.runtime")} for p in RUNTIME.rglob("*.py")
    }


def _layer(module: str) -> int:
    rest = module.removeprefix("resihp.runtime").lstrip(".")
    top = rest.split(".")[0]
    assert not rest or top in LAYERS, f"{module}: give `{top}` its layer in LAYERS (and docs/runtime.md)"
    return LAYERS[top] if rest else max(LAYERS.values())


def test_no_import_cycle_inside_the_runtime():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the DFS stack, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            if n not in graph:
                continue
            assert state.get(n) != 1, "import cycle: " + " -> ".join(path[path.index(n) :] + [n])
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_every_import_goes_to_the_same_or_a_lower_layer():
    """job/faults <- exec <- state <- adapt <- control <- config/train; the package's own
    __init__ re-exports lazily (by name, not by import)."""
    wrong = [
        f"{m} (layer {_layer(m)}) imports {n} (layer {_layer(n)})"
        for m, deps in _graph().items()
        if m != "resihp.runtime"
        for n in deps
        if n != "resihp.runtime" and _layer(n) > _layer(m)
    ]
    assert not wrong, "\n".join(wrong)


def test_production_code_never_imports_the_test_oracle():
    users = [_module(p) for p in ROOT.rglob("*.py") if "resihp.runtime.reference" in _imports(p)]
    assert users == []


def test_no_runtime_module_over_400_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in RUNTIME.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert long == {}


@pytest.mark.parametrize("module", TORCH_FREE)
def test_torch_free_modules_import_without_torch(module):
    """A node agent imports `control.agent` and never torch; the controller's bookkeeping and the
    replanning run without it too."""
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any `import torch` now raises ImportError
        f"import resihp.runtime.{module}\n"
        "assert not [m for m in sys.modules if m.startswith('torch') and sys.modules[m] is not None]"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_entry_points_load_from_the_package_on_first_use():
    """`import resihp.runtime` loads nothing heavy; each public name resolves to its module's."""
    code = "import sys, resihp.runtime; assert 'torch' not in sys.modules, sorted(sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60).returncode == 0
    import resihp.runtime as rt
    from resihp.runtime.control.controller import launch_elastic
    from resihp.runtime.train import run_training

    assert rt.run_training is run_training and rt.launch_elastic is launch_elastic
    assert all(getattr(rt, name).__name__ == name for name in rt.__all__)
    with pytest.raises(AttributeError):
        rt.Worker  # noqa: B018 (internals are imported from their module)
