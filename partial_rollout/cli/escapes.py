"""Snapshot text made safe to show: every control character as a Python-style escape.

A snapshot is input from elsewhere: its group ids, strings and decoded text may hold control
characters (``ESC [ 2 J`` clears a terminal) or bidirectional overrides (which make text read
differently from its bytes). Every view of a snapshot (``dump``'s text and JSON, ``dump --plot``'s
labels) shows them through these tables, so no view can be driven by the file it shows.
"""

from __future__ import annotations

CONTROL_CHARACTERS = [
    *range(0x20),  # C0 controls, ESC among them
    *range(0x7F, 0xA0),  # DEL and the C1 controls (0x9b is a one-byte CSI to some terminals)
    0x061C,
    0x200E,
    0x200F,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),  # bidirectional controls
]
ESCAPES = {c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" for c in CONTROL_CHARACTERS} | {
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
}
"""str.translate table: each control character to its Python-style escape."""
TEXT_ESCAPES = {c: e for c, e in ESCAPES.items() if c not in (ord("\n"), ord("\t"))}
"""The same, keeping line breaks and tabs, for decoded text shown as a block."""
JSON_ESCAPES = {c: f"\\u{c:04x}" for c in CONTROL_CHARACTERS if c >= 0x20}
"""For JSON output: what ``json.dumps`` escapes already (C0) is left to it."""


def printable(value: object) -> str:
    """``str(value)`` with every control character escaped, so snapshot content cannot drive the terminal."""
    return str(value).translate(ESCAPES)
