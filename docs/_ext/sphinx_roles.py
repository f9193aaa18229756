"""A Griffe extension for the docs site: the docstrings' reStructuredText bits, as Markdown.

The source's docstrings are Google-style (``Args:``, ``Returns:``, ``Raises:``) with Sphinx roles
(``:class:`~partial_rollout.engine.Cut```) and reST literal blocks (a paragraph ending in ``::``).
mkdocstrings renders Markdown, where a role would show as ``:class:`` followed by the target. This
extension rewrites each docstring before it is parsed: a role becomes a code span of its target
(the last component with ``~``, a title when one is given), and ``::`` ends a paragraph with ``:``
(a line holding only ``::`` is dropped), so the indented block after it renders as code.

Loaded by ``mkdocs.yml`` (``plugins.mkdocstrings.handlers.python.options.extensions``); used by no
code of the library.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj|const|ref):`([^`]+)`")
"""A Sphinx role and its content."""
TITLED = re.compile(r"^(?P<title>.+?)\s*<(?P<target>[^<>]+)>$")
"""``Title <target>`` inside a role."""


def _role(match: re.Match[str]) -> str:
    content = match.group(1).strip()
    titled = TITLED.match(content)
    if titled:
        return f"`{titled.group('title')}`"
    shown = content.lstrip("!")
    if shown.startswith("~"):
        shown = shown[1:].rsplit(".", 1)[-1]
    return f"`{shown.lstrip('.')}`"


def markdown(text: str) -> str:
    """``text`` (a docstring) with Sphinx roles as code spans and reST ``::`` blocks as Markdown code."""
    lines = []
    for line in ROLE.sub(_role, text).split("\n"):
        stripped = line.rstrip()
        if stripped.strip() == "::":
            continue
        if stripped.endswith("::"):
            line = stripped[:-1]
        lines.append(line)
    return "\n".join(lines)


class SphinxRoles(griffe.Extension):
    """Rewrite every docstring before mkdocstrings parses it."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
