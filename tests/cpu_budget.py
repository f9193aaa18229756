"""CPU seconds per test, so the CI time budget is spent where it is measured to go.

On the 2-core CI machine both cores are busy for most of a run, so a test's wall time says more about
what ran beside it than about its own cost. This plugin records, per test (set-up, call and
tear-down together), the CPU seconds of the pytest process and of every process it started and
reaped (an engine core, a trainer run, a Ray cluster and its workers), and with ``--cpu-top=N``
prints the N costliest and the total at the end. ``--cpu-json=FILE`` also writes them all as JSON.
A process that outlives its test is counted where it is reaped; one reparented away (a daemon) is not
counted at all.
"""

from __future__ import annotations

import json
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

_spent: dict[str, float] = {}


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cpu budget")
    group.addoption("--cpu-top", type=int, default=0, help="print the N tests that used the most CPU seconds")
    group.addoption("--cpu-json", default=None, help="write every test's CPU seconds to this JSON file")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    before = _cpu_seconds()
    yield
    _spent[item.nodeid] = _cpu_seconds() - before


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    top = config.getoption("--cpu-top")
    path = config.getoption("--cpu-json")
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(dict(sorted(_spent.items(), key=lambda kv: -kv[1])), indent=1))
    if top <= 0 or not _spent:
        return
    terminalreporter.section(f"CPU seconds: the {min(top, len(_spent))} costliest tests")
    for nodeid, seconds in sorted(_spent.items(), key=lambda kv: -kv[1])[:top]:
        terminalreporter.write_line(f"{seconds:8.1f}  {nodeid}")
    terminalreporter.write_line(f"{sum(_spent.values()):8.1f}  in all, {len(_spent)} tests")
