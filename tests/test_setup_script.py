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


# ``scripts/setup_nemo_rl.sh``: NeMo RL's controller venv, made from the project's .venv. Fakes stand in
# for the interpreters and pip as above: the engine venv's python reports a base interpreter, a Python
# and a Ray version; the base interpreter makes a venv whose pip records what it was asked to install.

FAKE_ENGINE_PYTHON = """#!/usr/bin/env bash
# .venv's python: its base interpreter, its Python version, its Ray version.
[[ "$2" == *importlib.metadata* ]] && echo "{base} {version} 2.60.0"
"""
FAKE_BASE_PYTHON = """#!/usr/bin/env bash
# A Python {version} that can make a venv; the venv's python answers the script's questions.
echo "$0 $*" >> "{calls}"
[[ "$1" == -m && "$2" == venv ]] || exit 1
mkdir -p "$3/bin" "$3/site-packages"
site=$(cd "$3/site-packages" && pwd)
printf '#!/usr/bin/env bash\\necho "pip $*" >> "{calls}"\\n' > "$3/bin/pip"
cat > "$3/bin/python" <<PY
#!/usr/bin/env bash
case "\\$2" in
  *purelib*) echo "$site" ;;
  *"(3, 12)"*) [[ "{version}" < 3.12 ]] ;;
  *nemo_rl*) echo "import nemo_rl with PYTHONPATH=\\$PYTHONPATH" >> "{calls}" ;;
  *) cat >/dev/null ;;  # the version checks and the import check read from stdin or pass
esac
PY
chmod +x "$3/bin/pip" "$3/bin/python"
"""


def nemo_rl_repo(tmp_path: Path, version: str = "3.11.7") -> Path:
    """A copy of the files setup_nemo_rl.sh reads, with a fake .venv whose base Python is ``version``."""
    repo = tmp_path / "repo"
    for name in (
        "scripts/setup_nemo_rl.sh",
        "integrations/nemo_rl/requirements-controller.txt",
        "integrations/nemo_rl/nemo_rl_py311.py",
        "integrations/nemo_rl/nemo_rl_py311.pth",
    ):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, repo / name)
    (repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    base = make_fake(tmp_path, "base-python", FAKE_BASE_PYTHON.format(version=version, calls=tmp_path / "calls.log"))
    (repo / ".venv" / "bin").mkdir(parents=True)
    make_fake(repo / ".venv" / "bin", "python", FAKE_ENGINE_PYTHON.format(base=base, version=version))
    (tmp_path / "calls.log").touch()
    return repo


def run_setup_nemo_rl(repo: Path, nemo_rl_src: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("NEMO_RL_SRC", "PYTHONPATH")}
    env["PATH"] = "/usr/bin:/bin"
    if nemo_rl_src is not None:
        env["NEMO_RL_SRC"] = str(nemo_rl_src)
    return subprocess.run(
        ["bash", "scripts/setup_nemo_rl.sh"], cwd=repo, env=env, capture_output=True, text=True, timeout=60
    )


def test_nemo_rl_setup_installs_the_pins_with_the_engine_venvs_ray_and_is_cheap_to_rerun(tmp_path: Path) -> None:
    repo = nemo_rl_repo(tmp_path)
    checkout = tmp_path / "nemo-rl"
    (checkout / "nemo_rl").mkdir(parents=True)
    (checkout / "nemo_rl" / "__init__.py").touch()
    result = run_setup_nemo_rl(repo, checkout)
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls[0] == f"{tmp_path / 'base-python'} -m venv .venv-nemo-rl"  # .venv's base interpreter
    pip = [c for c in calls if c.startswith("pip ")]
    assert any("-r integrations/nemo_rl/requirements-controller.txt ray[default]==2.60.0" in c for c in pip), pip
    assert any(c.endswith("--no-deps -e .") for c in pip), pip
    assert f"import nemo_rl with PYTHONPATH={checkout}" in calls
    for name in ("nemo_rl_py311.py", "nemo_rl_py311.pth"):
        shim = repo / ".venv-nemo-rl" / "site-packages" / name
        assert shim.read_text() == (REPO / "integrations" / "nemo_rl" / name).read_text()

    again = run_setup_nemo_rl(repo, checkout)
    assert again.returncode == 0, again.stderr
    assert again.stdout == "setup-nemo-rl: .venv-nemo-rl is up to date (python 3.11.7, ray 2.60.0)\n"
    assert (tmp_path / "calls.log").read_text().splitlines() == calls  # nothing ran

    with (repo / "integrations" / "nemo_rl" / "requirements-controller.txt").open("a") as f:
        f.write("six==1.17.0\n")
    changed = run_setup_nemo_rl(repo, checkout)
    assert changed.returncode == 0, changed.stderr
    assert len([c for c in (tmp_path / "calls.log").read_text().splitlines() if c.startswith("pip ")]) == 2 * len(pip)


def test_nemo_rl_setup_adds_the_py311_shim_only_below_python_3_12(tmp_path: Path) -> None:
    repo = nemo_rl_repo(tmp_path, version="3.12.3")
    result = run_setup_nemo_rl(repo)
    assert result.returncode == 0, result.stderr
    assert (repo / ".venv-nemo-rl" / ".nemo-rl-controller-installed").is_file()
    assert not list((repo / ".venv-nemo-rl" / "site-packages").glob("nemo_rl_py311*"))
    assert "import nemo_rl" not in (tmp_path / "calls.log").read_text()  # no checkout, no import check


def test_nemo_rl_setup_without_the_engine_venv_fails_with_one_line(tmp_path: Path) -> None:
    repo = nemo_rl_repo(tmp_path)
    shutil.rmtree(repo / ".venv")
    result = run_setup_nemo_rl(repo)
    assert result.returncode == 1
    assert result.stderr == (
        "setup-nemo-rl: .venv does not exist; run bash scripts/setup.sh first "
        "(this venv takes its Python and Ray version from it)\n"
    )
    assert not (repo / ".venv-nemo-rl").exists()


def test_nemo_rl_setup_with_a_folder_that_is_not_nemo_rl_fails_with_one_line(tmp_path: Path) -> None:
    repo = nemo_rl_repo(tmp_path)
    result = run_setup_nemo_rl(repo, tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith(f"setup-nemo-rl: NEMO_RL_SRC={tmp_path} has no nemo_rl/__init__.py")
    assert result.stderr.count("\n") == 1
    assert not (repo / ".venv-nemo-rl").exists()


def test_vllm_matrix_setup_without_the_engine_venv_fails_with_one_line(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup_vllm_matrix.sh", repo / "scripts")
    result = subprocess.run(
        ["bash", "scripts/setup_vllm_matrix.sh"],
        cwd=repo,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr == (
        "setup-vllm-matrix: .venv does not exist; run bash scripts/setup.sh first "
        "(the matrix takes its Python and its list of builds from it)\n"
    )
    assert not list(repo.glob(".venv-vllm-*"))
