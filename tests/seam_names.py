"""The framework names an integration uses, read from its source, and which of them its seams probe lacks.

Pure ``ast``, no framework needed, so it runs in the project's ``.venv`` (the fast loop) as well as
in the framework's own environment. ``roots`` are the framework's top-level packages (``("nemo_rl",)``;
``("verl", "transfer_queue")``). What counts as a use of the framework:

- an import from it: ``from verl.x import Y`` uses ``verl.x.Y``;
- an attribute read on a name bound to it (``import transfer_queue as tq; tq.kv_list``), down
  the chain while it names modules and classes (``trainer_base.PPOTrainer.fit``);
- in a class of ours deriving from a framework class, ``self.<name>`` and ``super().<name>`` where
  ``<name>`` is not defined in our class (its methods, class attributes and ``self.<name> =``
  assignments count as ours): they are the framework base's.

What it cannot see: an attribute read on an object the framework handed us (``controller._buffer``
with ``controller`` a parameter). Those names go in the seams by hand, and the probe checks them.

Methods our class defines that override the framework base's cannot be told from new ones without
the framework; :func:`overrides` lists every method defined, and :func:`overriding` keeps those the
real base has (run it in the framework's environment).
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from partial_rollout_integrations.seams import assigned_on_self, has_member, unwrap


@dataclass(frozen=True)
class Use:
    """One use of a framework name: the import it starts from and the attributes read after it."""

    where: str
    """``file:line``."""
    chain: tuple[str, ...]
    """A module, then attribute names: ``("verl.trainer.main_ppo", "TaskRunnerV1", "run")``."""


@dataclass(frozen=True)
class Override:
    """A method a class of ours defines, whose base is a framework class."""

    where: str
    base: tuple[str, ...]
    """The framework base, as a :attr:`Use.chain` (module, class)."""
    method: str


def _is_framework(module: str, roots: Sequence[str]) -> bool:
    return module.split(".")[0] in roots


def _chain(node: ast.expr, bound: dict[str, tuple[str, ...]]) -> tuple[str, ...] | None:
    """The framework chain an expression reads (``a.b.c`` with ``a`` bound to it), else ``None``."""
    attrs: list[str] = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "unwrap" and node.args:
        inner = _chain(node.args[0], bound)  # seams.unwrap(RayActorClass)
        return None if inner is None else (*inner, *reversed(attrs))
    if isinstance(node, ast.Name) and node.id in bound:
        return (*bound[node.id], *reversed(attrs))
    return None


def _own_names(cls: ast.ClassDef) -> set[str]:
    """What a class of ours defines: methods, class attributes, and attributes assigned on ``self``."""
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names | assigned_on_self(cls)


def _is_super_call(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def scan(source: str, roots: Sequence[str], filename: str = "<source>") -> tuple[list[Use], list[Override]]:
    """Every use of the framework ``roots`` and every method of a class derived from one of its
    classes, in one module's ``source``."""
    tree = ast.parse(source, filename=filename)
    for parent in ast.walk(tree):  # to record only the outermost attribute of a chain
        for child in ast.iter_child_nodes(parent):
            child.parent = parent  # type: ignore[attr-defined]
    bound: dict[str, tuple[str, ...]] = {}
    uses: list[Use] = []
    overrides: list[Override] = []

    def at(node: ast.AST) -> str:
        return f"{filename}:{getattr(node, 'lineno', 0)}"

    for node in ast.walk(tree):  # bindings first: a function-level import binds for the whole module
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_framework(alias.name, roots):
                    name = alias.asname or alias.name.split(".")[0]
                    bound[name] = (alias.name,) if alias.asname else (alias.name.split(".")[0],)
                    uses.append(Use(at(node), (alias.name,)))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and _is_framework(node.module, roots):
            for alias in node.names:
                bound[alias.asname or alias.name] = (node.module, alias.name)
                uses.append(Use(at(node), (node.module, alias.name)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            chain = _chain(node.value, bound)
            if chain is not None:
                bound[node.targets[0].id] = chain
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            chain = _chain(node.value, bound)
            if chain is not None:
                bound[node.target.id] = chain

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "parent", None), ast.Attribute):
            chain = _chain(node, bound)
            if chain is not None:
                uses.append(Use(at(node), chain))
        if isinstance(node, ast.ClassDef):
            bases = [c for c in (_chain(b, bound) for b in node.bases) if c is not None]
            if not bases:
                continue
            own = _own_names(node)
            for inner in ast.walk(node):
                if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef) and inner in node.body:
                    overrides += [Override(at(inner), base, inner.name) for base in bases]
                if not isinstance(inner, ast.Attribute):
                    continue
                via_super = _is_super_call(inner.value)
                via_self = isinstance(inner.value, ast.Name) and inner.value.id == "self" and inner.attr not in own
                if via_super or via_self:
                    uses += [Use(at(inner), (*base, inner.attr)) for base in bases]
    return uses, overrides


def scan_files(paths: Iterable[Path], roots: Sequence[str], root: Path) -> tuple[list[Use], list[Override]]:
    """:func:`scan` over source files, named relative to ``root``."""
    uses: list[Use] = []
    overrides: list[Override] = []
    for path in sorted(paths):
        u, o = scan(path.read_text(), roots, str(path.relative_to(root)))
        uses += u
        overrides += o
    return uses, overrides


class Probed:
    """What the seams probe covers: modules (and the packages above them), classes and members."""

    def __init__(self, seams: Sequence[Any]) -> None:
        self.modules = {s.module for s in seams}
        self.packages = {".".join(m.split(".")[:i]) for m in self.modules for i in range(1, m.count(".") + 1)}
        self.module_members = {(s.module, m) for s in seams if s.cls is None for m in s.members}
        self.classes = {(s.module, s.cls): s for s in seams if s.cls is not None}
        self._by_name = {s.cls: s for s in seams if s.cls is not None}

    def class_members(self, module: str, cls: str) -> set[str]:
        """Members probed on a class and on the probed bases it must derive from."""
        seam = self.classes[(module, cls)]
        members = set(seam.members)
        for base in seam.bases:
            base_seam = self._by_name[base]
            members |= self.class_members(base_seam.module, base)
        return members

    def missing(self, chain: tuple[str, ...]) -> str | None:
        """The first name along ``chain`` the probe lacks (``None``: covered)."""
        module, *attrs = chain
        if module not in self.modules | self.packages:
            return f"module {module}"
        cls: str | None = None
        for attr in attrs:
            if cls is not None:
                return None if attr in self.class_members(module, cls) else f"{module}.{cls}.{attr}"
            if f"{module}.{attr}" in self.modules | self.packages:
                module = f"{module}.{attr}"
            elif (module, attr) in self.classes:
                cls = attr
            elif (module, attr) in self.module_members:
                return None  # a function or a value: what it returns is not the framework's name any more
            else:
                return f"{module}.{attr}"
        return None


def uncovered(uses: Iterable[Use], seams: Sequence[Any]) -> list[str]:
    """``where: name`` for each use whose name the seams probe lacks."""
    probed = Probed(seams)
    out = []
    for use in uses:
        missing = probed.missing(use.chain)
        if missing is not None:
            out.append(f"{use.where}: {missing}")
    return out


def overriding(overrides: Iterable[Override]) -> list[Use]:
    """The methods of ours that override one the installed framework's base has, as uses of it."""
    out = []
    for override in overrides:
        module_name, *path = override.base
        base: Any = importlib.import_module(module_name)
        for name in path:
            base = getattr(base, name)
        base = unwrap(base)
        if isinstance(base, type) and has_member(base, override.method):
            out.append(Use(override.where, (*override.base, override.method)))
    return out


def unused(seams: Sequence[Any], paths: Iterable[Path], root: Path) -> list[str]:
    """``module[.class].member`` for each member a seam probes that no source file names.

    A name counts as named where it is read or written as an attribute, bound as a name, imported,
    defined, or written as a string (``getattr(x, "name")``): that catches the uses :func:`scan`
    cannot see (an attribute of an object the framework handed us), so only a member nothing in the
    sources mentions at all is reported. A probe of such a member refuses a framework release that
    dropped a name we never use.
    """
    named: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path.relative_to(root)))):
            if isinstance(node, ast.Attribute):
                named.add(node.attr)
            elif isinstance(node, ast.Name):
                named.add(node.id)
            elif isinstance(node, ast.alias):
                named.add((node.asname or node.name).rsplit(".", 1)[-1])
                named.add(node.name.rsplit(".", 1)[-1])
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                named.add(node.name)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                named.add(node.value)
    return [
        ".".join(filter(None, (seam.module, seam.cls, member)))
        for seam in seams
        for member in seam.members
        if member not in named
    ]
