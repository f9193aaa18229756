"""The upstream proposal's patch applies to NeMo RL and keeps NeMo RL's own tests passing.

``docs/nemo_rl_upstream_hooks.patch`` adds rollout lifecycle hooks to NeMo RL (the proposal is
``docs/nemo_rl_upstream_hooks.md``). A proposal whose patch no longer applies, breaks one of NeMo
RL's single-controller unit tests, or whose own test module fails, is worth nothing to a maintainer,
so this runs them as NeMo RL's CI would, on a patched copy of the ``NEMO_RL_SRC`` checkout. The doc
lists the files the patch touches; the patch must touch exactly those, so the two stay in step.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import nemo_rl_harness as harness
import pytest

pytestmark = [harness.needs_nemo_rl, pytest.mark.ray]

PATCH = harness.REPO / "docs" / "nemo_rl_upstream_hooks.patch"
DOC = harness.REPO / "docs" / "nemo_rl_upstream_hooks.md"
NEW_MODULE = "test_rollout_lifecycle"
NEW_MODULE_PASSED = 8
"""Tests in the module the patch adds (``tests/unit/single_controller/test_rollout_lifecycle.py``)."""
FILES_SECTION = "## Files the patch touches"


def patched_files(patch: Path) -> set[str]:
    """The paths a ``git diff`` changes or adds, from its ``diff --git a/X b/X`` headers."""
    headers = re.findall(r"^diff --git a/(\S+) b/(\S+)$", patch.read_text(), flags=re.MULTILINE)
    assert headers, f"{patch} has no `diff --git` header"
    for before, after in headers:
        assert before == after, f"{patch} renames {before} to {after}; the doc lists files, not renames"
    return {after for _, after in headers}


def documented_files(doc: Path) -> set[str]:
    """The backticked paths listed in the doc's section on the files the patch touches."""
    text = doc.read_text()
    assert FILES_SECTION in text, f"{doc} has no '{FILES_SECTION}' section"
    section = text.split(FILES_SECTION, 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`((?:nemo_rl|tests)/[\w./]+\.py)`", section))


def test_the_patch_touches_exactly_the_files_the_doc_names() -> None:
    """Doc and patch are edited by hand, separately: a file in one and not the other is a stale doc."""
    in_patch = patched_files(PATCH)
    assert in_patch == documented_files(DOC)
    assert f"tests/unit/single_controller/{NEW_MODULE}.py" in in_patch


def test_nemo_rl_unit_tests_pass_on_the_patched_copy(tmp_path: Path) -> None:
    """The hooks default to no-ops: every existing test passes unchanged, and the new module passes."""
    run = harness.run_unit_tests(harness.nemo_rl_src(), tmp_path, patch=PATCH, extra_modules=(NEW_MODULE,))
    expected = {**harness.EXPECTED_PASSED, NEW_MODULE: NEW_MODULE_PASSED}
    print(f"patched NeMo RL single-controller unit tests: {sum(expected.values())} in {run.wall_s:.0f} s")
    tail = run.output[-6000:]
    assert run.outcomes, f"pytest wrote no JUnit report (exit {run.returncode}):\n{tail}"
    assert run.outcomes == {m: Counter(passed=n) for m, n in expected.items()}, tail
    assert run.returncode == 0, tail
