"""The wheel reader's network handling: a blip is tried again, an answer that will not change is not."""

from __future__ import annotations

import io
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest
import vllm_wheels

URL = "https://files.example/vllm-0.0.0-cp38-abi3-manylinux_2_28_x86_64.whl"


class _Answer(io.BytesIO):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(body)
        self.status = status


def _server(monkeypatch: pytest.MonkeyPatch, answers: list[Any]) -> list[float]:
    """``urlopen`` answers (or raises) each of ``answers`` in turn; returns the sleeps between tries."""
    sleeps: list[float] = []

    def urlopen(request: urllib.request.Request, timeout: float) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    monkeypatch.setattr(vllm_wheels.urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(vllm_wheels.time, "sleep", sleeps.append)
    return sleeps


def test_a_lost_name_resolution_and_a_503_are_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    dns = urllib.error.URLError(socket.gaierror(-3, "Temporary failure in name resolution"))
    busy = urllib.error.HTTPError(URL, 503, "Service Unavailable", {}, None)  # type: ignore[arg-type]
    sleeps = _server(monkeypatch, [dns, busy, _Answer(206, b"abcd")])
    assert vllm_wheels._get(URL, 10, 14, "vLLM 0.0.0") == b"abcd"
    assert sleeps == [1, 2]


def test_a_lasting_failure_names_the_release_and_the_url(monkeypatch: pytest.MonkeyPatch) -> None:
    dns = urllib.error.URLError(socket.gaierror(-3, "Temporary failure in name resolution"))
    sleeps = _server(monkeypatch, [dns] * vllm_wheels.RETRIES)
    with pytest.raises(vllm_wheels.WheelError, match=rf"^vLLM 0.0.0: cannot read {URL}: .*name resolution"):
        vllm_wheels._get(URL, 10, 14, "vLLM 0.0.0")
    assert sleeps == [1, 2, 4, 8]


@pytest.mark.parametrize("answer", [urllib.error.HTTPError(URL, 404, "Not Found", {}, None), _Answer(200, b"whole")])  # type: ignore[arg-type]
def test_an_answer_that_will_not_change_is_not_tried_again(monkeypatch: pytest.MonkeyPatch, answer: Any) -> None:
    sleeps = _server(monkeypatch, [answer])
    with pytest.raises(vllm_wheels.WheelError, match=rf"^vLLM 0.0.0: .*{URL}"):
        vllm_wheels._get(URL, 10, 14, "vLLM 0.0.0")
    assert sleeps == []
