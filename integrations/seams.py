"""The probe behind each integration's set-up check: does this framework have every name we use?

A trainer integration relies on private classes, methods and attributes of a framework whose
internals move between releases (NeMo RL's single controller, verl's V1 trainer). Each integration
lists those names as :class:`Seam` rows in its own ``seams.py`` and runs :func:`check` before a
run starts, so a framework without one fails at set-up in one line naming it, never at the first
checkpoint. ``tests/seam_names.py`` reads the integration's source and fails the tests on a
framework name the list lacks.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from partial_rollout.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Seam:
    """Names of one framework module, or of one class in it, that an integration relies on."""

    module: str
    cls: str | None = None
    """A class of ``module`` (a Ray actor class is unwrapped); ``None``: ``members`` are the module's own."""
    members: tuple[str, ...] = ()
    """Functions, classes and values of the module; or methods, class attributes, fields (dataclass
    or pydantic) and instance attributes (assigned as ``self.<name>`` in a method of the
    class or a base) of the class."""
    bases: tuple[str, ...] = ()
    """Classes of other seams (by name) this class must derive from: their members are its members."""
    relied_on: tuple[str, ...] = ()
    """Members our code never names but whose behaviour it depends on (a method of the framework that
    calls one we override, say), each with a comment saying how; probed as ``members`` are. A member
    our code names goes in ``members``: the tests hold each list to exactly that."""


def unwrap(cls: object) -> object:
    """The Python class behind a Ray actor class (``@ray.remote``), or ``cls`` itself.

    Ray's ``modified_class`` is a subclass Ray made of that class, marked with ``__ray_actor_class__``;
    a class derived from it inherits the mark, and Ray would then name (and describe) the derived
    actor after the framework's class. Derive from what this returns, the class the framework wrote.
    """
    modified = getattr(getattr(cls, "__ray_metadata__", None), "modified_class", cls)
    return getattr(modified, "__ray_actor_class__", modified)


def assigned_on_self(tree: ast.AST) -> set[str]:
    """Attributes the code under ``tree`` assigns as ``self.<name>`` (a class's instance attributes)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                names.add(target.attr)
    return names


@functools.cache
def _instance_attributes(cls: type) -> frozenset[str]:
    """Attributes a method of ``cls`` or of its bases assigns as ``self.<name>``."""
    names: set[str] = set()
    for klass in cls.__mro__:
        try:
            names |= assigned_on_self(ast.parse(textwrap.dedent(inspect.getsource(klass))))
        except (OSError, TypeError):  # a builtin or C class: no source
            continue
    return frozenset(names)


def has_member(cls: type, name: str) -> bool:
    """Whether ``cls`` has ``name`` as a method, class attribute, field or instance attribute."""
    if hasattr(cls, name):
        return True
    if dataclasses.is_dataclass(cls) and name in {f.name for f in dataclasses.fields(cls)}:
        return True
    if name in getattr(cls, "model_fields", {}):  # a pydantic model
        return True
    return name in _instance_attributes(cls)


def check(seams: Sequence[Seam], fail: Callable[[str], ConfigError]) -> None:
    """Raise ``fail(what)`` for the first name of ``seams`` the installed framework lacks."""
    classes: dict[str, type] = {}
    for seam in seams:
        try:
            module = importlib.import_module(seam.module)
        except ImportError as e:
            raise fail(f"module {seam.module} ({e})") from e
        if seam.cls is None:
            for name in (*seam.members, *seam.relied_on):
                if not hasattr(module, name):
                    raise fail(f"{seam.module}.{name}")
            continue
        cls = unwrap(getattr(module, seam.cls, None))
        if not isinstance(cls, type):
            raise fail(f"class {seam.module}.{seam.cls}")
        classes[seam.cls] = cls
        for name in (*seam.members, *seam.relied_on):
            if not has_member(cls, name):
                raise fail(f"{seam.cls}.{name}")
    for seam in seams:
        for base in seam.bases:
            if seam.cls is not None and not issubclass(classes[seam.cls], classes[base]):
                raise fail(f"{seam.cls} derived from {base}")
