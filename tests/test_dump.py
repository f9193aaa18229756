"""``partial-rollout dump``: what it prints, and how it refuses bad input (one line, exit 3)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from snapshot_helpers import data_span, example_snapshot, fingerprints, patch_header, rewrite
from snapshot_helpers import sample as make_sample
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from partial_rollout.cli import main
from partial_rollout.engine import exactness
from partial_rollout.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_USAGE
from partial_rollout.fingerprint import tokenizer_fingerprint
from partial_rollout.snapshot import (
    SNAPSHOT_FILENAME,
    GroupRecord,
    GroupState,
    SampleRecord,
    SampleState,
    SamplingSpec,
    Snapshot,
    save_snapshot,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """A checkpoint folder holding the example snapshot."""
    folder = tmp_path / "step_7"
    folder.mkdir()
    save_snapshot(example_snapshot(), folder)
    return folder


def dump(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["dump", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_summary_and_table(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = dump(capsys, str(ckpt))
    assert status == EXIT_OK and err == ""
    assert str(ckpt / SNAPSHOT_FILENAME) in out
    assert "trainer step  7, policy version 3" in out
    assert "groups        4: 1 pending prompts, 2 in flight (1 partial), 1 ready" in out
    assert "samples       8: 3 not started, 2 in flight, 3 finished" in out
    assert "9 prefix tokens in flight, 20 generated in all, 8 prompt tokens" in out
    assert "in-flight tokens 2..3, all tokens 2..3, dispatched at 1..3" in out
    assert "yielded=9, consumed=4, evicted=1" in out and "too_stale=1" in out
    assert "tokenizer     sha256:tokenizer" in out and "vocab_size    1000" in out
    assert "in-flight samples: 2" in out
    rows = [line.split() for line in out.splitlines() if line.startswith(("partial-1", "flight-2"))]
    assert rows[0][:8] == ["partial-1", "1", "2", "5", "59", "3", "yes", "16"]
    assert " ".join(rows[0][9:]) == "presence_penalty counts only output tokens"
    assert rows[1] == ["flight-2", "0", "1", "4", "6", "2..3", "no", "no", "-"]


def test_json_schema(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json has the documented keys, and its counts agree with Snapshot.counts()."""
    status, out, _ = dump(capsys, str(ckpt), "--json")
    assert status == EXIT_OK
    report = json.loads(out)
    assert set(report) == {
        "path", "format", "format_version", "writer", "trainer_step", "policy_version", "fingerprints",
        "counts", "policy_versions", "counters", "evicted_by_reason", "size", "in_flight",
    }  # fmt: skip
    counts = example_snapshot().counts()
    assert {k: report["counts"][k] for k in counts} == counts
    assert (
        report["counts"]["groups"] == 4 and report["counts"]["samples"] == 8 and report["counts"]["prompt_tokens"] == 8
    )
    assert report["policy_versions"] == {"in_flight_tokens": [2, 3], "all_tokens": [2, 3], "dispatch": [1, 3]}
    assert report["size"]["file_bytes"] == (ckpt / SNAPSHOT_FILENAME).stat().st_size
    assert report["size"]["sampler_state_bytes"] == 16
    assert report["size"]["bytes_per_token"] == pytest.approx((report["size"]["file_bytes"] - 16) / 20, abs=1e-3)
    assert report["in_flight"]["rows"][0] == {
        "group_id": "partial-1",
        "sample": 1,
        "prompt_tokens": 2,
        "prefix_tokens": 5,
        "max_tokens": 64,
        "remaining_tokens": 59,
        "versions": [3, 3],
        "seeded": True,
        "sampler_state_bytes": 16,
        "inexact": "presence_penalty counts only output tokens",
    }


def test_limit(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = dump(capsys, str(ckpt), "--limit", "1")
    assert "(1 more in-flight samples not shown; --limit 0 shows all)" in out and "flight-2" not in out
    _, out, _ = dump(capsys, str(ckpt), "--limit", "1", "--json")
    assert json.loads(out)["in_flight"] | {"rows": None} == {"total": 2, "shown": 1, "rows": None}
    _, out, _ = dump(capsys, str(ckpt), "--limit", "0")
    assert "flight-2" in out and "more in-flight" not in out
    with pytest.raises(SystemExit) as info:
        main(["dump", str(ckpt), "--limit", "-1"])
    assert info.value.code == EXIT_USAGE


def test_request_token_by_token(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = dump(capsys, str(ckpt), "--request", "partial-1/1")
    assert status == EXIT_OK
    assert "sample partial-1/1: in_flight (group in_flight, dispatched at version 2)" in out
    assert "prompt 2 tokens, prefix 5 tokens, max_tokens 64, remaining 59" in out
    assert "seed=1001" in out and "sampler state 16 bytes" in out
    table = [line.split() for line in out.splitlines() if line.strip() and line.split()[0].isdigit()]
    expected_logprobs = -np.linspace(0.1, 1.0, 5, dtype=np.float32)
    assert [row[:2] for row in table] == [[str(i), str(10 + i)] for i in range(5)]
    assert [float(row[2]) for row in table] == pytest.approx(expected_logprobs.tolist(), abs=1e-4)
    assert {row[3] for row in table} == {"3"}

    _, out, _ = dump(capsys, str(ckpt), "--request", "partial-1/1", "--json")
    report = json.loads(out)
    assert [t["id"] for t in report["tokens"]] == [10, 11, 12, 13, 14]
    assert [t["logprob"] for t in report["tokens"]] == expected_logprobs.tolist()
    assert report["sampling"]["seed"] == 1001 and report["data"] == {"task": "code"}


def test_request_id_syntax(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """GROUP/INDEX always works; a plain group id only when the group has one sample."""
    status, out, _ = dump(capsys, str(ckpt), "--request", "flight-2")
    assert status == EXIT_OK and "sample flight-2/0" in out
    for request, message in (
        ("partial-1", "group 'partial-1' has 3 samples; name one as partial-1/0 .. partial-1/2"),
        ("partial-1/3", "group 'partial-1' has samples 0..2, not 3"),
        ("nope/0", "no request 'nope/0'"),
    ):
        status, _, err = dump(capsys, str(ckpt), "--request", request)
        assert status == EXIT_BAD_INPUT
        assert err.count("\n") == 1 and "--request" in err and message in err


def train_tokenizer(folder: Path, corpus: list[str]) -> Tokenizer:
    """A small byte-level BPE with special tokens, trained here so the test needs no download."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|bos|>", "<|eos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return tokenizer


CORPUS = ["hello world", "the quick brown fox", "h\u00e9llo w\u00f6rld \u2713", "what is 6 times 7?"] * 5


def text_snapshot(tokenizer: Tokenizer, tokenizer_dir: Path, **fingerprint_fields: str) -> Snapshot:
    prefix = [tokenizer.token_to_id("<|bos|>"), *tokenizer.encode("h\u00e9llo w\u00f6rld \u2713").ids]
    sample = SampleRecord(
        index=0,
        state=SampleState.IN_FLIGHT,
        sampling=SamplingSpec(max_tokens=64),
        token_ids=prefix,
        logprobs=[-0.5] * len(prefix),
        versions=[1] * len(prefix),
    )
    group = GroupRecord(
        group_id="q-1",
        prompt_token_ids=tokenizer.encode("what is 6 times 7?").ids,
        state=GroupState.IN_FLIGHT,
        dispatch_version=1,
        samples=[sample],
    )
    fp = fingerprints(
        tokenizer=tokenizer_fingerprint(tokenizer_dir), vocab_size=tokenizer.get_vocab_size(), **fingerprint_fields
    )
    return Snapshot(trainer_step=1, policy_version=1, fingerprints=fp, groups=[group])


@pytest.mark.parametrize("where", ["checkpoint", "tokenizer subfolder", "model_path", "--tokenizer"])
def test_decode_finds_the_checkpoint_tokenizer(tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str) -> None:
    ckpt, model = tmp_path / "ckpt", tmp_path / "model"
    tokenizer_dir = {
        "checkpoint": ckpt,
        "tokenizer subfolder": ckpt / "tokenizer",
        "model_path": model,
        "--tokenizer": model,
    }[where]
    tokenizer = train_tokenizer(tokenizer_dir, CORPUS)
    ckpt.mkdir(exist_ok=True)
    save_snapshot(text_snapshot(tokenizer, tokenizer_dir, model_path=str(model) if where == "model_path" else ""), ckpt)
    extra = ["--tokenizer", str(model)] if where == "--tokenizer" else []
    status, out, err = dump(capsys, str(ckpt), "--decode", *extra)
    assert status == EXIT_OK, err
    prefix_tokens = len(tokenizer.encode("h\u00e9llo w\u00f6rld \u2713").ids) + 1
    assert f"--- q-1/0 ({prefix_tokens} tokens, versions 1)" in out
    assert "<|bos|>h\u00e9llo w\u00f6rld \u2713" in out


def test_decode_shows_a_version_mix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A prefix that spanned a weight update: its versions and its inexact declaration, in every view."""
    tokenizer = train_tokenizer(tmp_path / "ckpt", CORPUS)
    snapshot = text_snapshot(tokenizer, tmp_path / "ckpt")
    sample = snapshot.groups[0].samples[0]
    mix = exactness.version_mix(0, 1, 1)
    versions = np.array([0] * 3 + [1] * (sample.num_tokens - 3), dtype=np.int32)
    mixed = dataclasses.replace(sample, versions=versions, inexact=mix)
    first = dataclasses.replace(snapshot.groups[0], samples=[mixed, *snapshot.groups[0].samples[1:]])
    save_snapshot(dataclasses.replace(snapshot, groups=[first, *snapshot.groups[1:]]), tmp_path / "ckpt")
    _, out, _ = dump(capsys, str(tmp_path / "ckpt"), "--decode")
    assert f"--- q-1/0 ({sample.num_tokens} tokens, versions 0..1, inexact: {mix})" in out
    _, out, _ = dump(capsys, str(tmp_path / "ckpt"))
    row = next(line for line in out.splitlines() if line.startswith("q-1 "))
    assert row.split()[5] == "0..1" and row.endswith(mix)
    _, out, _ = dump(capsys, str(tmp_path / "ckpt"), "--request", "q-1/0", "--json")
    report = json.loads(out)
    assert report["inexact"] == mix and [t["version"] for t in report["tokens"]] == versions.tolist()


def test_request_with_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokenizer = train_tokenizer(tmp_path / "ckpt", CORPUS)
    save_snapshot(text_snapshot(tokenizer, tmp_path / "ckpt"), tmp_path / "ckpt")
    status, out, _ = dump(capsys, str(tmp_path / "ckpt"), "--request", "q-1/0", "--decode", "--json")
    assert status == EXIT_OK
    report = json.loads(out)
    assert report["text"] == "<|bos|>h\u00e9llo w\u00f6rld \u2713"
    assert report["tokens"][0]["text"] == "<|bos|>"
    assert "".join(t["text"] for t in report["tokens"]) == report["text"]
    status, out, _ = dump(capsys, str(tmp_path / "ckpt"), "--request", "q-1/0", "--decode")
    assert '"<|bos|>"' in out and out.rstrip().endswith("<|bos|>h\u00e9llo w\u00f6rld \u2713")


EVIL = "\x1b[2J\x9b31m\u202eevil\r"
"""Clears the screen, a one-byte CSI, a right-to-left override and a carriage return."""
RAW_CONTROLS = ("\x1b", "\x9b", "\u202e", "\r")


def evil_snapshot(tokenizer: Tokenizer, tokenizer_dir: Path) -> Snapshot:
    """Control characters wherever a snapshot holds text: group id, decoded tokens, strings, data."""
    prefix = tokenizer.encode(f"line one{EVIL}\nline two").ids
    sample = SampleRecord(
        index=0,
        state=SampleState.IN_FLIGHT,
        sampling=SamplingSpec(max_tokens=64, stop=(EVIL,)),
        token_ids=prefix,
        logprobs=[-0.5] * len(prefix),
        versions=[1] * len(prefix),
        inexact=f"why{EVIL}",
    )
    group = GroupRecord(
        group_id=f"q{EVIL}",
        prompt_token_ids=[1],
        state=GroupState.IN_FLIGHT,
        dispatch_version=1,
        samples=[sample],
        data={"answer": EVIL},
    )
    fp = fingerprints(
        tokenizer=tokenizer_fingerprint(tokenizer_dir), vocab_size=tokenizer.get_vocab_size(), model_path=EVIL
    )
    return Snapshot(trainer_step=1, policy_version=1, fingerprints=fp, groups=[group], counters={EVIL: 1})


def test_control_characters_are_printed_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A crafted snapshot cannot drive the terminal: every control character comes out escaped."""
    ckpt = tmp_path / "ckpt"
    tokenizer = train_tokenizer(ckpt, CORPUS)
    save_snapshot(evil_snapshot(tokenizer, ckpt), ckpt)
    escaped = "\\x1b[2J\\x9b31m\\u202eevil\\r"
    request = f"q{EVIL}/0"
    for args in ([], ["--decode"], ["--request", request], ["--request", request, "--decode"]):
        status, out, err = dump(capsys, str(ckpt), *args)
        assert status == EXIT_OK, err
        assert not any(c in out for c in RAW_CONTROLS), (args, out)
        assert f"q{escaped}" in out, (args, out)
    _, out, _ = dump(capsys, str(ckpt), "--decode")
    assert f"line one{escaped}\nline two" in out  # decoded text keeps its line breaks
    assert f"model_path    {escaped}" in out and f"{escaped}=1" in out
    _, out, _ = dump(capsys, str(ckpt))
    assert f"why{escaped}" in out
    _, out, _ = dump(capsys, str(ckpt), "--request", request, "--decode")
    assert f"stop=['{escaped}']" in out and f'data: {{"answer": "\\u001b{escaped[4:]}"}}' in out

    for args in (["--json", "--decode"], ["--request", request, "--json", "--decode"]):
        status, out, _ = dump(capsys, str(ckpt), *args)
        assert status == EXIT_OK and not any(c in out for c in RAW_CONTROLS)
        report = json.loads(out)  # escaped, yet the same strings
        group_id = report["group_id"] if "group_id" in report else report["in_flight"]["rows"][0]["group_id"]
        assert group_id == f"q{EVIL}"
        assert (report.get("text") or report["in_flight"]["rows"][0]["text"]) == f"line one{EVIL}\nline two"


def test_decode_refuses_another_tokenizer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tokenizer whose sha256 differs from the fingerprint would print the wrong text: refused."""
    tokenizer = train_tokenizer(tmp_path / "ckpt", CORPUS)
    save_snapshot(text_snapshot(tokenizer, tmp_path / "ckpt"), tmp_path / "ckpt")
    train_tokenizer(tmp_path / "other", [*CORPUS, "another corpus entirely"])
    status, out, err = dump(capsys, str(tmp_path / "ckpt"), "--decode", "--tokenizer", str(tmp_path / "other"))
    assert status == EXIT_BAD_INPUT and out == ""
    assert (
        err.count("\n") == 1 and "fingerprints.tokenizer" in err and str(tmp_path / "other" / "tokenizer.json") in err
    )
    (tmp_path / "ckpt" / "tokenizer.json").unlink()
    status, _, err = dump(capsys, str(tmp_path / "ckpt"), "--decode")
    assert status == EXIT_BAD_INPUT and "tokenizer: no tokenizer.json found" in err and "--tokenizer DIR" in err


def test_verify(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--verify exits 0 when intact and 3 when damaged; the summary checks the checksums too."""
    status, out, _ = dump(capsys, str(ckpt), "--verify")
    assert status == EXIT_OK and "intact: 4 groups, 8 samples, 20 tokens" in out

    path = ckpt / SNAPSHOT_FILENAME
    raw = bytearray(path.read_bytes())
    raw[data_span(path, "sample.tokens")[0]] ^= 0x10
    damaged = tmp_path / "damaged.safetensors"
    damaged.write_bytes(raw)
    status, out, err = dump(capsys, str(damaged), "--verify")
    assert status == EXIT_BAD_INPUT and out == ""
    assert err.count("\n") == 1 and f"{damaged}: sample.tokens: checksum mismatch" in err
    status, out, _ = dump(capsys, str(damaged), "--verify", "--json")
    report = json.loads(out)
    assert status == EXIT_BAD_INPUT and report["intact"] is False and "sample.tokens" in report["error"]
    status, out, err = dump(capsys, str(damaged))
    assert status == EXIT_BAD_INPUT and out == "" and "sample.tokens: checksum mismatch" in err
    status, _, err = dump(capsys, str(ckpt), "--verify", "--decode")
    assert status == EXIT_USAGE and "cannot be combined" in err


def bad_inputs(good: Path, folder: Path) -> dict[str, tuple[Path, str]]:
    """Each kind of bad input the issue names, with the field its error must name."""
    raw = good.read_bytes()
    cases: dict[str, tuple[Path, str]] = {}

    def write(name: str, data: bytes, field: str) -> None:
        path = folder / f"{name}.safetensors"
        path.write_bytes(data)
        cases[name] = (path, field)

    write("empty", b"", "header")
    write("truncated", raw[: len(raw) // 2], "header")
    write("not-safetensors", b"step,loss\n1,0.5\n", "header")
    flipped = bytearray(raw)
    flipped[data_span(good, "sample.logprobs")[0] + 1] ^= 0x04
    write("flipped", bytes(flipped), "sample.logprobs")

    def past_end(header: dict) -> None:
        header["group.state"]["data_offsets"][1] += 64
        header["group.state"]["shape"][0] += 64

    cases["offsets-past-end"] = (patch_header(good, folder / "past.safetensors", past_end), "group.state")
    wrong_dtype = rewrite(
        good,
        folder / "dtype.safetensors",
        tensors=lambda a: a.update({"sample.logprobs": a["sample.logprobs"].astype(np.float64)}),
    )
    cases["wrong-dtype"] = (wrong_dtype, "sample.logprobs")
    cases["missing-tensor"] = (
        rewrite(good, folder / "missing.safetensors", tensors=lambda a: a.pop("sample.reward")),
        "sample.reward",
    )
    cases["malformed-json"] = (
        rewrite(good, folder / "json.safetensors", metadata=lambda m: m.update(counters="{")),
        "counters",
    )
    cases["version-2"] = (
        rewrite(good, folder / "v2.safetensors", metadata=lambda m: m.update(format_version="2")),
        "format_version",
    )
    return cases


CASES = [
    "empty",
    "truncated",
    "not-safetensors",
    "flipped",
    "offsets-past-end",
    "wrong-dtype",
    "missing-tensor",
    "malformed-json",
    "version-2",
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mode", [[], ["--json"], ["--verify"], ["--request", "flight-2/0"]])
def test_bad_input_is_one_line_exit_3(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, mode: list[str]
) -> None:
    path, field = bad_inputs(ckpt / SNAPSHOT_FILENAME, tmp_path)[case]
    status, out, err = dump(capsys, str(path), *mode)
    assert status == EXIT_BAD_INPUT
    assert out == ""
    assert err.startswith(f"error: {path}: {field}: ") and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_missing_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = dump(capsys, str(tmp_path / "nope"))
    assert status == EXIT_BAD_INPUT and err == f"error: {tmp_path / 'nope'}: no such file or folder\n"
    status, _, err = dump(capsys, str(tmp_path))
    assert status == EXIT_BAD_INPUT and "no partial_rollouts.safetensors in this folder" in err


def test_debug_shows_the_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty.safetensors").write_bytes(b"")
    assert main(["--debug", "dump", str(tmp_path / "empty.safetensors")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "Traceback" in err and "SnapshotError" in err and "the file is empty" in err


def test_command_line_process(ckpt: Path, tmp_path: Path) -> None:
    """The real console entry point: exit status 3 and a single line, no traceback, for a truncated file."""
    raw = (ckpt / SNAPSHOT_FILENAME).read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(raw[:100])
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run = subprocess.run(
        [sys.executable, "-m", "partial_rollout.cli", "dump", str(tmp_path / "cut.safetensors")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == EXIT_BAD_INPUT
    assert run.stdout == "" and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert run.stderr.startswith(f"error: {tmp_path / 'cut.safetensors'}: header: ")
    help_run = subprocess.run(
        [sys.executable, "-m", "partial_rollout.cli", "dump", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert help_run.returncode == 0 and "examples:" in help_run.stdout and "GROUP_ID/SAMPLE_INDEX" in help_run.stdout


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_png(path: Path) -> np.ndarray:
    from matplotlib import image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    pixels: np.ndarray = image.imread(path)
    return pixels


def test_plot_writes_a_png_beside_the_summary(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, plain, _ = dump(capsys, str(ckpt))
    target = tmp_path / "plots" / "snapshot.png"
    target.parent.mkdir()
    status, out, err = dump(capsys, str(ckpt), "--plot", str(target))
    assert status == EXIT_OK and err == ""
    assert out == f"{plain}wrote {target}: 4 groups, 8 samples drawn\n"
    height, width, _ = read_png(target).shape
    assert height >= 300 and width >= 800
    assert list(target.parent.iterdir()) == [target]  # no temporary left behind

    status, out, err = dump(capsys, str(ckpt), "--json", "--plot", str(target))
    assert status == EXIT_OK and json.loads(out)["counts"]["groups"] == 4  # stdout stays JSON
    assert err == f"wrote {target}: 4 groups, 8 samples drawn\n"


def test_plot_of_hundreds_of_samples_draws_the_in_flight_groups_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """320 samples would be bars too thin to read: 60 rows are drawn, in-flight groups first, and it says so."""
    states = [GroupState.READY] * 20 + [GroupState.PENDING] * 8 + [GroupState.IN_FLIGHT] * 12
    sample_state = {GroupState.PENDING: SampleState.NOT_STARTED, GroupState.IN_FLIGHT: SampleState.IN_FLIGHT}
    groups = [
        GroupRecord(
            group_id=f"g{g}",
            prompt_token_ids=[1],
            state=state,
            dispatch_version=-1 if state is GroupState.PENDING else 2,
            samples=[
                make_sample(
                    i, sample_state.get(state, SampleState.FINISHED), 0 if state is GroupState.PENDING else i + 1
                )
                for i in range(8)
            ],
        )
        for g, state in enumerate(states)
    ]
    save_snapshot(Snapshot(trainer_step=9, policy_version=3, fingerprints=fingerprints(), groups=groups), tmp_path)
    status, out, _ = dump(capsys, str(tmp_path), "--plot", str(tmp_path / "big.png"))
    assert status == EXIT_OK
    assert out.splitlines()[-1] == f"wrote {tmp_path / 'big.png'}: 8 of 40 groups, 60 of 320 samples drawn"
    height, _, _ = read_png(tmp_path / "big.png").shape
    assert height <= 2000  # 60 rows, not 320


def test_plot_refusals_are_one_line_before_anything_is_read(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "plots").mkdir()
    png = str(tmp_path / "plots" / "p.png")
    for args, message in (
        (["--verify"], "--plot cannot be combined with --verify or --request"),
        (["--request", "flight-2/0"], "--plot cannot be combined with --verify or --request"),
    ):
        status, out, err = dump(capsys, str(ckpt), *args, "--plot", png)
        assert status == EXIT_USAGE and out == "" and err == f"partial-rollout dump: error: {message}\n"
    for target, message in (
        (tmp_path / "no" / "p.png", f"no such folder {tmp_path / 'no'}"),
        (ckpt / SNAPSHOT_FILENAME / "p.png", f"no such folder {ckpt / SNAPSHOT_FILENAME}"),
        (tmp_path / "p.svg", "the plot is a PNG; name it FILE.png"),
    ):
        status, out, err = dump(capsys, str(ckpt), "--plot", str(target))
        assert status == EXIT_USAGE and out == ""
        assert err == f"partial-rollout dump: error: --plot {target}: {message}\n"
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a)
    )
    status, out, err = dump(capsys, str(ckpt), "--plot", png)
    assert status == EXIT_USAGE and out == ""
    assert err == "partial-rollout dump: error: --plot needs matplotlib: pip install 'partial-rollout[bench]'\n"
    assert list((tmp_path / "plots").iterdir()) == []


def test_plot_that_cannot_be_written_is_one_line(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failure to write the PNG names it; the temporary is removed (here: a folder holds its name)."""
    taken = tmp_path / "plots" / "p.png"
    taken.mkdir(parents=True)
    status, out, err = dump(capsys, str(ckpt), "--plot", str(taken))
    assert status == EXIT_BAD_INPUT and "in flight" in out  # the summary came first
    assert err == f"error: {taken}: --plot: cannot write it: Is a directory\n"
    assert list(taken.parent.iterdir()) == [taken] and list(taken.iterdir()) == []
