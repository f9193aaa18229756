"""``partial-rollout dump``: see what a checkpoint's snapshot holds.

The summary and the table are computed from the snapshot's structural tensors (a few bytes per
sample); ``--request`` and ``--decode`` read only the tokens they print. Every mode first streams
the whole file through its checksums (one sequential read, constant memory, no tokens decoded), so
a damaged file is reported rather than summarised; ``--verify`` also loads the snapshot and checks
every rule of the format.

A snapshot is input from elsewhere, so the text output shows every control character in it as a
Python-style escape (``\\x1b``, ``\\u202e``: :mod:`partial_rollout.cli.escapes`; backslashes themselves
are left alone); decoded text keeps its line breaks and tabs. ``--json`` output escapes them too.

``--plot FILE.png`` also draws the snapshot (:mod:`partial_rollout.cli.dump_plot`) next to the
summary it prints; it needs matplotlib, the optional ``bench`` extra, and is refused (exit 2) before
anything is read when that is missing or the file cannot be named as asked.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from partial_rollout.cli.dump_plot import plot_snapshot
from partial_rollout.cli.escapes import JSON_ESCAPES, TEXT_ESCAPES, printable
from partial_rollout.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_USAGE, BadInputError, SnapshotError
from partial_rollout.fingerprint import TOKENIZER_FILENAME, find_tokenizer_file, tokenizer_fingerprint
from partial_rollout.snapshot.reader import SnapshotReader
from partial_rollout.snapshot.schema import GroupRecord, SampleRecord
from partial_rollout.snapshot.summary import summarize

EXAMPLES = """\
examples:
  partial-rollout dump ckpt/step_120                 summary and in-flight samples
  partial-rollout dump ckpt/step_120 --limit 0       ... with every in-flight sample
  partial-rollout dump ckpt/step_120 --json          the same, machine-readable
  partial-rollout dump ckpt/step_120 --request math-17/3
                                                     sample 3 of group math-17, token by token
  partial-rollout dump ckpt/step_120 --decode        in-flight prefixes as text
  partial-rollout dump run/partial_rollouts.safetensors --decode --tokenizer models/qwen
  partial-rollout dump ckpt/step_120 --verify        full integrity check (exit 0 intact, 3 damaged)
  partial-rollout dump ckpt/step_120 --plot step_120.png
                                                     the summary, and the snapshot drawn: each sample's
                                                     prefix by policy version, its budget left, the
                                                     groups' states (needs partial-rollout[bench])

A request ID is GROUP_ID/SAMPLE_INDEX (the index within the group, from 0); a group with one
sample can be named by its group id alone. --decode and the text column of --request use
--tokenizer DIR, else the first tokenizer.json found in the checkpoint folder, in its tokenizer/
subfolder, or at the model path recorded in the snapshot; its sha256 must match the snapshot's
tokenizer fingerprint.

exit status: 0 success (and intact), 2 bad usage, 3 bad input (damaged, mismatched, unknown
version; one line names the file and the field), 1 anything else.
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``dump`` subcommand to the ``partial-rollout`` parser."""
    p = subparsers.add_parser(
        "dump",
        help="show what a snapshot holds (summary, one request, prefixes as text, integrity)",
        description="Show what a partial-rollout snapshot holds: a summary and a table of in-flight samples.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", metavar="PATH", help="a snapshot file, or a checkpoint folder holding one")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--request", metavar="ID", help="show one sample token by token (ID = GROUP_ID/SAMPLE_INDEX)")
    mode.add_argument("--verify", action="store_true", help="check every checksum and rule; exit 0 intact, 3 damaged")
    p.add_argument("--json", action="store_true", help="print JSON instead of text (schema in docs/snapshot_format.md)")
    p.add_argument("--decode", action="store_true", help="show prefixes as text (needs the run's tokenizer)")
    p.add_argument("--tokenizer", metavar="DIR", help="tokenizer.json or its folder, to show text (implies --decode)")
    p.add_argument(
        "--limit", metavar="N", type=_count, default=50, help="in-flight samples to list (default 50; 0 = all)"
    )
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw the snapshot into a PNG (needs partial-rollout[bench]; not with --verify or --request)",
    )
    p.set_defaults(func=run)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    """Run ``dump`` with parsed ``args``; returns the exit status."""
    if args.verify and (args.decode or args.tokenizer):
        print("partial-rollout dump: error: --verify cannot be combined with --decode or --tokenizer", file=sys.stderr)
        return EXIT_USAGE
    if args.plot is not None:
        refused = _plot_refusal(args)
        if refused:
            print(f"partial-rollout dump: error: {refused}", file=sys.stderr)
            return EXIT_USAGE
    if args.verify:
        return _verify(args)
    with SnapshotReader(args.path) as reader:
        reader.verify_checksums()
        tokenizer = _load_tokenizer(reader, args.tokenizer) if args.decode or args.tokenizer else None
        if args.request is not None:
            group, sample = _find_request(reader, args.request)
            report = _request(group, sample, tokenizer)
            print(_json(report) if args.json else _format_request(report))
            return EXIT_OK
        summary = summarize(reader, limit=args.limit)
        if tokenizer is not None:
            for row in summary["in_flight"]["rows"]:
                sample = reader.group(row["group_id"]).samples[row["sample"]]
                row["text"] = tokenizer.decode(sample.token_ids.tolist(), skip_special_tokens=False)
        print(_json(summary) if args.json else _format_summary(summary))
        if args.plot is not None:
            drawn = plot_snapshot(reader, summary, Path(args.plot))
            # stdout carries nothing but the JSON under --json
            print(f"wrote {printable(args.plot)}: {drawn} drawn", file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK


def _plot_refusal(args: argparse.Namespace) -> str | None:
    """Why ``--plot`` cannot be done as asked, found before the snapshot is read (so nothing is half done)."""
    if args.verify or args.request is not None:
        return "--plot cannot be combined with --verify or --request"
    target = Path(args.plot)
    if target.suffix.lower() != ".png":
        return f"--plot {printable(args.plot)}: the plot is a PNG; name it FILE.png"
    if not target.parent.is_dir():
        return f"--plot {printable(args.plot)}: no such folder {printable(target.parent)}"
    if importlib.util.find_spec("matplotlib") is None:
        return "--plot needs matplotlib: pip install 'partial-rollout[bench]'"
    return None


def _verify(args: argparse.Namespace) -> int:
    try:
        with SnapshotReader(args.path) as reader:
            reader.verify()
            result = {
                "path": str(reader.path),
                "intact": True,
                "groups": reader.num_groups,
                "samples": reader.num_samples,
                "tokens": reader.num_tokens,
                "tensors": len(reader.tensor_names),
            }
    except SnapshotError as exc:
        if not args.json:
            raise
        print(_json({"path": args.path, "intact": False, "error": str(exc)}))
        return EXIT_BAD_INPUT
    if args.json:
        print(_json(result))
    else:
        print(
            f"{printable(result['path'])}: intact: {result['groups']} groups, {result['samples']} samples,"
            f" {result['tokens']} tokens; the checksums of {result['tensors']} tensors and of the metadata"
            " match, every rule holds"
        )
    return EXIT_OK


def _load_tokenizer(reader: SnapshotReader, given: str | None) -> Any:
    """The run's tokenizer, refusing one whose sha256 differs from the snapshot's fingerprint."""
    if given is not None:
        file = find_tokenizer_file(given)
    else:
        folder = reader.path.parent
        candidates = [folder / TOKENIZER_FILENAME, folder / "tokenizer" / TOKENIZER_FILENAME]
        if reader.fingerprints.model_path:
            candidates.append(Path(reader.fingerprints.model_path) / TOKENIZER_FILENAME)
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise BadInputError(
                f"no {TOKENIZER_FILENAME} found (looked in {', '.join(str(c.parent) for c in candidates)})",
                path=reader.path,
                field="tokenizer",
                fix="Pass --tokenizer DIR with the tokenizer the run used.",
            )
        file = found
    digest = tokenizer_fingerprint(file)
    if digest != reader.fingerprints.tokenizer:
        raise SnapshotError(
            f"{file} hashes to {digest}, but the snapshot was written with {reader.fingerprints.tokenizer}",
            path=reader.path,
            field="fingerprints.tokenizer",
            fix="Pass --tokenizer DIR with the tokenizer the run used.",
        )
    from tokenizers import Tokenizer  # only --decode needs it

    try:
        return Tokenizer.from_file(str(file))
    except Exception as exc:
        raise BadInputError(f"tokenizers cannot load it: {exc}", path=file, field="tokenizer") from None


def _find_request(reader: SnapshotReader, request: str) -> tuple[GroupRecord, SampleRecord]:
    """Resolve ``GROUP_ID/SAMPLE_INDEX``, or a plain group id when that group has one sample."""
    head, _, tail = request.rpartition("/")
    if head and tail.isdigit() and head in reader.group_ids:
        group = reader.group(head)
        index = int(tail)
        last = len(group.samples) - 1
        if index > last:
            raise BadInputError(f"group {head!r} has samples 0..{last}, not {index}", field="--request")
        return group, group.samples[index]
    if request in reader.group_ids:
        group = reader.group(request)
        last = len(group.samples) - 1
        if last:
            what = f"group {request!r} has {last + 1} samples; name one as {request}/0 .. {request}/{last}"
            raise BadInputError(what, field="--request")
        return group, group.samples[0]
    fix = "IDs look like GROUP_ID/SAMPLE_INDEX; `dump` lists them."
    raise BadInputError(f"no request {request!r} in {reader.path}", field="--request", fix=fix)


def _request(group: GroupRecord, sample: SampleRecord, tokenizer: Any) -> dict[str, Any]:
    ids = sample.token_ids.tolist()
    tokens = [
        {"position": i, "id": token, "logprob": logprob, "version": version}
        for i, (token, logprob, version) in enumerate(
            zip(ids, sample.logprobs.tolist(), sample.versions.tolist(), strict=True)
        )
    ]
    report = {
        "group_id": group.group_id,
        "sample": sample.index,
        "state": sample.state.value,
        "group_state": group.state.value,
        "dispatch_version": group.dispatch_version,
        "prompt_tokens": len(group.prompt_token_ids),
        "prefix_tokens": len(ids),
        "remaining_tokens": sample.remaining_tokens,
        "sampling": sample.sampling.to_json(),
        "finish_reason": sample.finish_reason,
        "stop_reason": sample.stop_reason,
        "reward": sample.reward,
        "sampler_state_bytes": len(sample.sampler_state or b""),
        "inexact": sample.inexact,
        "data": group.data,
        "tokens": tokens,
    }
    if tokenizer is not None:
        for token in tokens:
            token["text"] = tokenizer.decode([token["id"]], skip_special_tokens=False)
        report["text"] = tokenizer.decode(ids, skip_special_tokens=False)
    return report


def _format_request(r: dict[str, Any]) -> str:
    sampling = r["sampling"]
    lines = [
        f"sample {printable(r['group_id'])}/{r['sample']}: {r['state']}"
        f" (group {r['group_state']}, dispatched at version {r['dispatch_version']})",
        f"prompt {r['prompt_tokens']} tokens, prefix {r['prefix_tokens']} tokens, max_tokens {sampling['max_tokens']},"
        f" remaining {r['remaining_tokens']}",
        "sampling: " + " ".join(f"{k}={printable(v)}" for k, v in sampling.items() if k != "max_tokens"),
        f"finish_reason {printable(r['finish_reason'])}, stop_reason {printable(r['stop_reason'])},"
        f" reward {r['reward']}",
        f"sampler state {r['sampler_state_bytes']} bytes, inexact: {printable(r['inexact'] or 'no')}",
        f"data: {printable(json.dumps(r['data'], ensure_ascii=False))}",
    ]
    header = ["position", "id", "logprob", "version"] + (["text"] if "text" in r else [])
    rows = [
        [str(t["position"]), str(t["id"]), f"{t['logprob']:.4f}", str(t["version"])]
        + ([printable(json.dumps(t["text"], ensure_ascii=False))] if "text" in t else [])
        for t in r["tokens"]
    ]
    lines += ["", *_table(header, rows, numeric=range(4))]
    if "text" in r:
        lines += ["", "text:", r["text"].translate(TEXT_ESCAPES)]
    return "\n".join(lines)


def _format_summary(s: dict[str, Any]) -> str:
    c, v, size = s["counts"], s["policy_versions"], s["size"]
    per_token = "n/a" if size["bytes_per_token"] is None else f"{size['bytes_per_token']:.2f}"
    lines = [
        printable(s["path"]),
        f"  format        {s['format']} v{s['format_version']}, written by {printable(s['writer'])}",
        f"  trainer step  {s['trainer_step']}, policy version {s['policy_version']}",
        f"  groups        {c['groups']}: {c['groups_pending']} pending prompts, {c['groups_in_flight']} in flight"
        f" ({c['groups_partial']} partial), {c['groups_ready']} ready",
        f"  samples       {c['samples']}: {c['samples_not_started']} not started, {c['samples_in_flight']} in flight,"
        f" {c['samples_finished']} finished",
        f"  tokens        {c['tokens_in_flight']} prefix tokens in flight, {c['tokens']} generated in all,"
        f" {c['prompt_tokens']} prompt tokens",
        f"  versions      in-flight tokens {_span(v['in_flight_tokens'])}, all tokens {_span(v['all_tokens'])},"
        f" dispatched at {_span(v['dispatch'])}",
        f"  counters      {_pairs(s['counters'])}",
        f"  evicted       {_pairs(s['evicted_by_reason'])}",
        f"  size          {size['file_bytes']:,} bytes, {size['sampler_state_bytes']:,} of them sampler states;"
        f" {per_token} bytes per generated token besides sampler states",
        "  fingerprints",
        *(f"    {k:<13} {printable(val)}" for k, val in s["fingerprints"].items()),
        "",
    ]
    table = s["in_flight"]
    lines.append(f"in-flight samples: {table['total']}")
    rows = table["rows"]
    if rows and "text" in rows[0]:
        for row in rows:
            versions = _span(row["versions"])
            inexact = f", inexact: {printable(row['inexact'])}" if row["inexact"] else ""
            lines.append(
                f"--- {printable(row['group_id'])}/{row['sample']}"
                f" ({row['prefix_tokens']} tokens, versions {versions}{inexact})"
            )
            lines.append(row["text"].translate(TEXT_ESCAPES))
    elif rows:
        header = ["group", "sample", "prompt", "prefix", "remaining", "versions", "seeded", "sampler_state", "inexact"]
        body = [
            [
                printable(row["group_id"]),
                str(row["sample"]),
                str(row["prompt_tokens"]),
                str(row["prefix_tokens"]),
                str(row["remaining_tokens"]),
                _span(row["versions"]),
                "yes" if row["seeded"] else "no",
                f"{row['sampler_state_bytes']} B" if row["sampler_state_bytes"] else "no",
                printable(row["inexact"] or "-"),
            ]
            for row in rows
        ]
        lines += _table(header, body, numeric=range(1, 5))
    left_out = table["total"] - table["shown"]
    if left_out:
        lines.append(f"({left_out} more in-flight samples not shown; --limit 0 shows all)")
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[str]], *, numeric: range) -> list[str]:
    """Aligned columns; those in ``numeric`` are right-aligned."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        out = []
        for i, (cell, width) in enumerate(zip(cells, widths, strict=True)):
            out.append(cell.rjust(width) if i in numeric else cell.ljust(width))
        return "  ".join(out).rstrip()

    return [line(header), *(line(row) for row in rows)]


def _span(span: list[int] | None) -> str:
    if span is None:
        return "-"
    return str(span[0]) if span[0] == span[1] else f"{span[0]}..{span[1]}"


def _pairs(counts: dict[str, int]) -> str:
    return ", ".join(f"{printable(k)}={v}" for k, v in counts.items()) or "-"


def _json(value: object) -> str:
    """Indented JSON; non-ASCII text stays readable, control characters JSON itself leaves raw
    (DEL, C1, bidirectional) are escaped as ``\\uXXXX``."""
    return json.dumps(value, ensure_ascii=False, indent=2).translate(JSON_ESCAPES)
