"""The library's layers import only downwards; the trainers and benchmarks sit on top of it, never inside it.

Every import statement of every module is read from its source (function-level imports too), so
a lazy import cannot hide an edge. ``from package import name`` where ``name`` is a module of that
package (a file or folder beside its ``__init__``) is the import of that module, so reaching a
private module through its package is seen too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOUNDATION = {"partial_rollout", "partial_rollout.errors", "partial_rollout.atomic", "partial_rollout.fingerprint"}
ALLOWED = {
    "partial_rollout.snapshot": FOUNDATION,
    "partial_rollout.ledger": FOUNDATION | {"partial_rollout.snapshot"},
    "partial_rollout.models": FOUNDATION,
    "partial_rollout.engine": FOUNDATION | {"partial_rollout.snapshot"},
    "partial_rollout.pool": FOUNDATION | {"partial_rollout.snapshot", "partial_rollout.engine"},
    "partial_rollout.checkpoint": FOUNDATION
    | {"partial_rollout.snapshot", "partial_rollout.ledger", "partial_rollout.engine"},
}
"""Each layer (a subpackage) may import itself and these (their modules too: a name one layer hands
another, such as the ledger's cut, is no trainer's business and stays out of the package's
``__all__``), nothing else of the project."""
INTEGRATIONS = "partial_rollout_integrations"
BENCHMARKS = "benchmarks"
PUBLIC = FOUNDATION | {f"partial_rollout.{p}" for p in ("engine", "pool", "ledger", "snapshot", "checkpoint", "models")}
"""What the trainers and the benchmarks may import of the library: a package, never a module inside
one (what a package's ``__init__`` exports is its API; its modules may be split or renamed)."""
BENCHMARK_PUBLIC = PUBLIC | {"partial_rollout.cli"}
"""Benchmarks also time the ``partial-rollout`` command in-process (:func:`partial_rollout.cli.main`,
the console script's entry point). The trainers may not: the command line imports them."""
EXEMPT = {
    ("benchmarks.snapshot_io", "partial_rollout.engine.cut"): "times the engine's own cut on synthetic requests",
    ("benchmarks.snapshot_io", "partial_rollout.engine.live"): "builds the synthetic live requests it cuts",
    ("benchmarks.resume.engine_calls", "partial_rollout.engine.factory"): "adds a stat logger timing each step",
    ("benchmarks.resume.engine_calls", "partial_rollout.engine.progress"): "counts steps as the engine does",
    ("benchmarks.resume.engine_calls", "partial_rollout.pool.cluster"): "places its recording actors as the pool does",
    ("benchmarks.resume.engine_calls", "partial_rollout.pool.pool"): "its recording actor is the pool's own host",
    ("benchmarks.steady.runs", "partial_rollout.engine.factory"): "plain vLLM from the config our engine uses",
    ("benchmarks.steady.runs", "partial_rollout.pool.cluster"): "plain vLLM actors placed as the pool's are",
}
"""Private imports allowed, with why: the frozen-window benchmark measures the engine adapter's
internals without an engine (no public name should expose them); the resume benchmark times each
engine step, which needs a stat logger of its own in the engine the pool's actor starts; the
steady-state benchmark's baseline is plain vLLM built and placed exactly as our engines are."""


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "integrations":
        parts[0] = INTEGRATIONS
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _folder(package: str) -> Path:
    parts = package.split(".")
    if parts[0] == INTEGRATIONS:
        parts[0] = "integrations"
    return ROOT.joinpath(*parts)


def _exports(package: str) -> set[str]:
    """The names a package's ``__init__`` exports: its ``__all__``, else every name it binds or type-checks."""
    init = _folder(package) / "__init__.py"
    if not init.is_file():
        return set()
    body = ast.parse(init.read_text()).body
    statements = [*body, *(s for node in body if isinstance(node, ast.If) for s in node.body)]
    bound: set[str] = set()
    for node in statements:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            try:
                return set(ast.literal_eval(node.value))
            except ValueError:
                continue  # computed (``sorted(_EXPORTS)``): the names bound count
        if isinstance(node, ast.Assign):
            bound.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
    return bound


def _is_submodule(package: str, name: str) -> bool:
    """Whether ``from package import name`` imports a module (a file or folder), not a name the package exports.

    ``from partial_rollout.ledger import audit`` is the function its ``__init__`` exports, though a
    module ``ledger/audit.py`` exists too.
    """
    folder = _folder(package)
    is_module = (folder / f"{name}.py").is_file() or (folder / name / "__init__.py").is_file()
    return is_module and name not in _exports(package)


def _imports(source: str, filename: str = "<source>") -> set[str]:
    """Every module ``source`` imports, a submodule imported from its package included."""
    out = set()
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names if _is_submodule(node.module, a.name))
    return out


def _project_modules() -> dict[str, set[str]]:
    roots = ("partial_rollout", INTEGRATIONS, BENCHMARKS)
    sources = [p for folder in ("partial_rollout", "integrations", BENCHMARKS) for p in (ROOT / folder).rglob("*.py")]
    return {_module(p): {i for i in _imports(p.read_text(), str(p)) if i.split(".")[0] in roots} for p in sources}


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _private(imports: set[str], public: set[str]) -> list[str]:
    """The library modules in ``imports`` that are not one of its ``public`` packages."""
    return sorted(i for i in imports if _within(i, "partial_rollout") and i not in public)


def test_layers_import_only_downwards() -> None:
    modules = _project_modules()
    assert len(modules) > 30, "the walk found the sources"
    bad = []
    for module, imports in modules.items():
        for layer, allowed in ALLOWED.items():
            if _within(module, layer):
                below = (a for a in allowed if a != "partial_rollout")  # the root package, not all of it
                bad += [
                    (module, i)
                    for i in imports
                    if not _within(i, layer) and i not in allowed and not any(_within(i, a) for a in below)
                ]
    assert not bad, f"imports against the layering: {bad}"


def test_the_library_imports_no_trainer() -> None:
    """Not even its command line: the trainers add their subcommands through entry points."""
    modules = _project_modules()
    offenders = sorted(
        m
        for m, imports in modules.items()
        if _within(m, "partial_rollout") and any(_within(i, INTEGRATIONS) for i in imports)
    )
    assert offenders == []
    assert any(_within(i, INTEGRATIONS) for i in modules[f"{INTEGRATIONS}.demo"]), "the walk sees the trainers' imports"


def test_neither_the_library_nor_the_trainers_import_the_benchmarks() -> None:
    modules = _project_modules()
    offenders = sorted(
        m
        for m, imports in modules.items()
        if not _within(m, BENCHMARKS) and any(_within(i, BENCHMARKS) for i in imports)
    )
    assert offenders == []


def test_the_trainers_and_benchmarks_use_the_library_only_through_its_public_packages() -> None:
    modules = _project_modules()
    assert any(_within(m, BENCHMARKS) for m in modules), "the walk sees the benchmarks"
    found = []
    for module, imports in modules.items():
        if _within(module, INTEGRATIONS) or _within(module, BENCHMARKS):
            public = BENCHMARK_PUBLIC if _within(module, BENCHMARKS) else PUBLIC
            found += [(module, i) for i in _private(imports, public)]
    offenders = [edge for edge in found if edge not in EXEMPT]
    assert not offenders, f"private modules (import from the package, or export the name there): {offenders}"
    stale = sorted(set(EXEMPT) - set(found))
    assert not stale, f"these imports are gone, remove them from EXEMPT: {stale}"


def test_a_module_imported_from_its_package_is_seen_as_that_module() -> None:
    source = (
        "from partial_rollout.engine import EnginePool, vllm_internals\n"
        "from partial_rollout.ledger import audit\n"
        "from partial_rollout import cli, engine, errors\n"
        "def lazy():\n"
        "    from partial_rollout.snapshot.container import read_header\n"
    )
    assert _private(_imports(source), PUBLIC) == [
        "partial_rollout.cli",
        "partial_rollout.engine.vllm_internals",
        "partial_rollout.snapshot.container",
    ]
