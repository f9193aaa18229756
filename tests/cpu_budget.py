"""CPU seconds per test, so the CI time budget is spent where it is measured to go.

On the 2-core CI machine both cores are busy for most of a run, so a test's wall time says more about
what ran beside it than about its own cost. This plugin records, per test (set-up, call and
tear-down together), the CPU seconds of the pytest process and of every process under it: an engine
core, a trainer run, a Ray cluster and its workers. Ray's workers are children of its raylet and are
killed, not reaped by us, so ``RUSAGE_CHILDREN`` would miss them: the descendants are read from
``/proc`` every half second (and at each test's start and end) instead, which misses at most the
last half second of each process (a process that leaves the tree, a daemon, stops counting). A
sample reads the tree's ``/proc`` files only, a few dozen. With ``--cpu-top=N`` it prints the N
costliest tests and the total at the end; ``--cpu-json=FILE`` writes them all.
"""

from __future__ import annotations

import json
import os
import resource
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_kills import process_tree

INTERVAL_S = 0.5
_TICK = os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


class _Descendants:
    """The CPU seconds the processes under this one spent, charged to the test running meanwhile."""

    def __init__(self) -> None:
        self.spent: defaultdict[str, float] = defaultdict(float)
        self.current: str | None = None
        self._seen: dict[tuple[int, int], float] = {}  # (pid, start tick) -> CPU seconds last read
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-budget", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self.sample()

    def sample(self) -> None:
        with self._lock:
            for pid in process_tree(os.getpid())[1:]:
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue  # gone meanwhile
                key = (pid, int(fields[19]))  # a pid freed and reused starts again from 0
                cpu = (int(fields[11]) + int(fields[12])) / _TICK
                delta = cpu - self._seen.get(key, 0.0)
                self._seen[key] = cpu
                if self.current is not None and delta > 0:
                    self.spent[self.current] += delta

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


_descendants: _Descendants | None = None
_spent: dict[str, float] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cpu budget")
    group.addoption("--cpu-top", type=int, default=0, help="print the N tests that used the most CPU seconds")
    group.addoption("--cpu-json", default=None, help="write every test's CPU seconds to this JSON file")


def pytest_configure(config: pytest.Config) -> None:
    global _descendants
    if config.getoption("--cpu-top") > 0 or config.getoption("--cpu-json"):
        _descendants = _Descendants()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    if _descendants is None:
        yield
        return
    _descendants.sample()  # what ran before this test is not its
    _descendants.current = item.nodeid
    before = _own_seconds()
    yield
    _descendants.sample()
    _descendants.current = None
    _spent[item.nodeid] = _own_seconds() - before + _descendants.spent.pop(item.nodeid, 0.0)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if _descendants is None:
        return
    _descendants.close()
    ranked = sorted(_spent.items(), key=lambda kv: -kv[1])
    path = config.getoption("--cpu-json")
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(dict(ranked), indent=1))
    top = config.getoption("--cpu-top")
    if top <= 0 or not ranked:
        return
    terminalreporter.section(f"CPU seconds: the {min(top, len(ranked))} costliest tests")
    for nodeid, seconds in ranked[:top]:
        terminalreporter.write_line(f"{seconds:8.1f}  {nodeid}")
    terminalreporter.write_line(f"{sum(_spent.values()):8.1f}  in all, {len(ranked)} tests")
