"""The documentation site builds in strict mode, and strict mode catches a broken link.

``mkdocs.yml`` turns on mkdocs 1.6's link validation (missing pages, missing anchors, unrecognised
links) as warnings and ``strict: true`` turns every warning into a failed build; the API reference
is mkdocstrings reading the source with Griffe (nothing imported, so no vLLM). The first test builds
the real site as ``mkdocs build --strict`` does; the second builds a copy of it with one link to a
missing page and one to a missing anchor, and the build must fail naming the page and both links, so
that the first test's green means the links were checked. Needs the ``docs`` extra
(``pip install -e ".[docs]"``); without it the tests fail, saying so.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS_PACKAGES = {
    "mkdocs": "mkdocs",
    "mkdocs-material": "material",
    "mkdocstrings": "mkdocstrings",
    "mkdocstrings-python": "mkdocstrings_handlers.python",
}
"""The ``docs`` extra's distributions, by the module each installs."""
BUILD_TIMEOUT_S = 300


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def _mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    missing = [dist for dist, module in DOCS_PACKAGES.items() if not _installed(module)]
    if missing:
        pytest.fail(
            f"the docs extra is not installed in {sys.prefix} (missing: {', '.join(missing)}): "
            'run `pip install -e ".[docs]"`',
            pytrace=False,
        )
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's end-of-life banner
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=config.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )


def test_the_site_builds_in_strict_mode_with_the_api_reference_and_the_plots(tmp_path: Path) -> None:
    site = tmp_path / "site"
    result = _mkdocs_build(ROOT / "mkdocs.yml", site)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "WARNING" not in result.stdout, result.stdout[-4000:]

    # The API reference renders each public package's names from the source, the Sphinx roles as code.
    checkpoint = (site / "api" / "checkpoint" / "index.html").read_text()
    assert 'id="partial_rollout.checkpoint.RolloutCheckpointer"' in checkpoint
    for page in ("checkpoint", "snapshot", "engine", "ledger", "pool", "errors"):
        html = (site / "api" / page / "index.html").read_text()
        assert ":class:`" not in html and ":meth:`" not in html, page
    assert 'id="partial_rollout.ledger.audit.audit"' in (site / "api" / "ledger" / "index.html").read_text()

    # The plots are served from benchmarks/results through the docs/benchmarks/results link, as files.
    benchmarks = (site / "benchmarks" / "index.html").read_text()
    for plot in sorted((ROOT / "benchmarks" / "results").glob("*.png")):
        assert f'src="results/{plot.name}"' in benchmarks, plot.name
        served = site / "benchmarks" / "results" / plot.name
        assert served.is_file() and not served.is_symlink() and served.stat().st_size == plot.stat().st_size
    assert not list((site / "benchmarks" / "results").glob("*.json"))  # referenced by path, not served


def test_a_broken_link_or_anchor_fails_the_strict_build_naming_the_page_and_the_link(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy2(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", copy / "docs", symlinks=True)  # docs/benchmarks/results stays a link
    shutil.copytree(ROOT / "benchmarks" / "results", copy / "benchmarks" / "results")
    # The API pages become plain pages: rendering the API is the first test's (most of a build's time),
    # and every link to them still resolves.
    for api_page in (copy / "docs" / "api").glob("*.md"):
        api_page.write_text(f"# {api_page.stem}\n")

    page = copy / "docs" / "concepts.md"
    text = page.read_text()
    for good in ("(exact_resume.md#how-a-cut-is-taken)", "(snapshot_format.md)"):
        assert good in text, f"the test breaks the link {good} of concepts.md, which is gone: pick another"
    text = text.replace("(exact_resume.md#how-a-cut-is-taken)", "(exact_resume.md#no-such-anchor)", 1)
    page.write_text(text.replace("(snapshot_format.md)", "(no_such_page.md)", 1))

    result = _mkdocs_build(copy / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    errors = [line for line in result.stdout.splitlines() if line.startswith("WARNING")]
    assert any("'concepts.md'" in line and "'no_such_page.md'" in line for line in errors), result.stdout[-4000:]
    assert any(
        "'concepts.md'" in line and "'exact_resume.md#no-such-anchor'" in line and "anchor" in line for line in errors
    ), result.stdout[-4000:]
    assert "Aborted with 2 warnings in strict mode!" in result.stdout


def test_every_relative_link_of_the_readme_names_a_file_of_the_repository() -> None:
    """The README is read on a code host, not on the site: its links to pages and tests are checked here."""
    readme = (ROOT / "README.md").read_text()
    targets = {t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme) if "://" not in t}
    assert targets, "the README links to its docs and evidence"
    missing = sorted(t for t in targets if not (ROOT / t).exists())
    assert not missing, f"README.md links to files that do not exist: {missing}"
