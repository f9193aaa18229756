"""The library's layers import only downwards; the trainers sit on top of it, never inside it.

Every import statement of every module is read from its source (function-level imports too), so
a lazy import cannot hide an edge.
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
}
"""Each layer (a subpackage) may import itself and these, nothing else of the project."""
INTEGRATIONS = "partial_rollout_integrations"


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "integrations":
        parts[0] = INTEGRATIONS
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _project_modules() -> dict[str, set[str]]:
    sources = [*(ROOT / "partial_rollout").rglob("*.py"), *(ROOT / "integrations").rglob("*.py")]
    return {
        _module(p): {i for i in _imports(p) if i.split(".")[0] in ("partial_rollout", INTEGRATIONS)} for p in sources
    }


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_layers_import_only_downwards() -> None:
    modules = _project_modules()
    assert len(modules) > 30, "the walk found the sources"
    bad = []
    for module, imports in modules.items():
        for layer, allowed in ALLOWED.items():
            if _within(module, layer):
                bad += [(module, i) for i in imports if not _within(i, layer) and not any(i == a for a in allowed)]
    assert not bad, f"imports against the layering: {bad}"


def test_only_the_command_line_layer_imports_the_trainers() -> None:
    modules = _project_modules()
    offenders = sorted(
        m
        for m, imports in modules.items()
        if _within(m, "partial_rollout")
        and not _within(m, "partial_rollout.cli")
        and any(_within(i, INTEGRATIONS) for i in imports)
    )
    assert offenders == []
    assert any(_within(i, INTEGRATIONS) for i in modules["partial_rollout.cli.demo"]), "the walk sees CLI imports"


def test_the_trainers_use_the_library_only_through_its_public_engine_package() -> None:
    for module, imports in _project_modules().items():
        if _within(module, INTEGRATIONS):
            private = [i for i in imports if _within(i, "partial_rollout.engine") and i != "partial_rollout.engine"]
            assert private == [], (module, private)
