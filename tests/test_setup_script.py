"""``scripts/setup.sh`` picks a Python >= 3.11 by version, not by the name ``python3.11``.

The script runs for real in a copy of the repository layout, with fake interpreters first on PATH:
a fake answers the version check with the version it pretends to be, and ``-m venv DIR`` with a
venv whose ``pip`` and ``python`` succeed without installing anything.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/usr/bin/env bash
# A Python that is version {version}; records how it was called.
echo "$0 $*" >> "{calls}"
if [[ "$1" == -c && "$2" == *version_info* && "$2" == *exit* ]]; then
  [[ "{version}" == 3.1[1-9]* ]]  # the script's check: succeed for >= 3.11
  exit
fi
if [[ "$1" == -c ]]; then echo "{version}"; exit 0; fi
if [[ "$1" == -m && "$2" == venv ]]; then
  mkdir -p "$3/bin"
  for tool in python pip; do printf '#!/bin/sh\\nexit 0\\n' > "$3/bin/$tool"; chmod +x "$3/bin/$tool"; done
fi
"""
BROKEN_SHIM = """#!/usr/bin/env bash
echo "pyenv: $(basename "$0"): command not found" >&2
exit 127
"""


def make_fake(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    path.chmod(0o755)
    return path


def run_setup(
    tmp_path: Path, pythons: dict[str, str | None], *, python_env: str | None = None
) -> subprocess.CompletedProcess:
    """Run a copy of setup.sh with these fake interpreters (version, or None for a broken pyenv shim)."""
    repo, fakes = tmp_path / "repo", tmp_path / "bin"
    (repo / "scripts").mkdir(parents=True)
    fakes.mkdir()
    shutil.copy(REPO / "scripts" / "setup.sh", repo / "scripts" / "setup.sh")
    (repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    calls = tmp_path / "calls.log"
    calls.touch()
    for name in ("python3.13", "python3.12", "python3.11", "python3"):  # shadow the real ones
        version = pythons.get(name)
        text = BROKEN_SHIM if version is None else FAKE_PYTHON.format(version=version, calls=calls)
        make_fake(fakes, name, text)
    env = {**os.environ, "PATH": f"{fakes}:/usr/bin:/bin"}
    env.pop("PYTHON", None)
    if python_env is not None:
        env["PYTHON"] = python_env
    return subprocess.run(["bash", "scripts/setup.sh"], cwd=repo, env=env, capture_output=True, text=True, timeout=60)


def venv_made_with(tmp_path: Path) -> str:
    calls = (tmp_path / "calls.log").read_text().splitlines()
    (line,) = [c for c in calls if " -m venv " in c]
    return Path(line.split()[0]).name


def test_picks_the_first_python_that_runs_and_is_recent_enough(tmp_path: Path) -> None:
    """python3.13 is a broken pyenv shim and python3.12 is too old: python3.11 is used."""
    result = run_setup(
        tmp_path, {"python3.13": None, "python3.12": "3.10.4", "python3.11": "3.11.9", "python3": "3.12.1"}
    )
    assert result.returncode == 0, result.stderr
    assert venv_made_with(tmp_path) == "python3.11"
    assert "setup: creating .venv with python3.11 (3.11.9)" in result.stdout
    assert (tmp_path / "repo" / ".venv" / ".partial-rollout-installed").is_file()  # the stamp is still written


def test_falls_back_to_python3(tmp_path: Path) -> None:
    result = run_setup(tmp_path, {"python3": "3.13.0"})
    assert result.returncode == 0, result.stderr
    assert venv_made_with(tmp_path) == "python3"


def test_the_python_variable_wins(tmp_path: Path) -> None:
    custom = make_fake(tmp_path, "mypython", FAKE_PYTHON.format(version="3.12.2", calls=tmp_path / "calls.log"))
    result = run_setup(tmp_path, {"python3.13": "3.13.0"}, python_env=str(custom))
    assert result.returncode == 0, result.stderr
    assert venv_made_with(tmp_path) == "mypython"


@pytest.mark.parametrize(
    ("pythons", "python_env", "message"),
    [
        (
            {"python3": "3.10.12"},
            None,
            "setup: no Python >= 3.11 found on PATH (tried python3.13 python3.12 python3.11 python3)",
        ),
        (
            {"python3.13": "3.13.0"},
            "/nowhere/python",
            "setup: PYTHON=/nowhere/python does not run or is older than 3.11",
        ),
    ],
)
def test_no_suitable_python_fails_with_one_line(
    tmp_path: Path, pythons: dict[str, str | None], python_env: str | None, message: str
) -> None:
    result = run_setup(tmp_path, pythons, python_env=python_env)
    assert result.returncode == 1
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "repo" / ".venv").exists()
