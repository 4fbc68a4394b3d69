"""A Griffe extension (mkdocs.yml: mkdocstrings' ``extensions``): delayq's reST docstrings
read as the Markdown mkdocstrings renders them.

- ``>>>`` examples become ``pycon`` code blocks with their doctest flags
  (``# doctest: +SKIP``) removed; Markdown alone reads ``>>>`` as three nested quotes.
- A ``::`` literal block becomes a fenced code block, and its ``::`` a ``:``.
- Sphinx roles (``:class:`~delayq.Publisher```, ``:meth:`run <delayq.Consumer.run>```)
  become code (```Publisher```, ```run```).

``tests/unit/test_docs_site.py`` tests :func:`as_markdown` and the built site.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

__all__ = ["DocstringsAsMarkdown", "as_markdown"]

_PROMPT = re.compile(r"^( *)>>>(?: |$)")
_FLAGS = re.compile(r"\s*#\s*doctest:\s*[+-]\w+(?:[\s,]+[+-]\w+)*")
_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj|const):`~?([^`]+)`")
_LITERAL = re.compile(r"^( *)(.*?)( ?)::$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _role(match: re.Match[str]) -> str:
    target = match.group(1)
    titled = re.fullmatch(r"(.+?)\s*<[^>]+>", target, re.S)  # :meth:`title <target>`
    if titled:
        return f"`{' '.join(titled.group(1).split())}`"
    if match.group(0).split("`", 1)[1].startswith("~"):
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def as_markdown(text: str) -> str:
    """The docstring ``text`` with its doctest and literal blocks fenced, roles as code."""
    lines = _ROLE.sub(_role, text).splitlines()  # a role may span two lines
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        prompt = _PROMPT.match(line)
        if prompt:  # a doctest block: up to the next blank line, as doctest reads it
            pad = prompt.group(1)
            out.append(f"{pad}```pycon")
            while i < len(lines) and lines[i].strip():
                out.append(_FLAGS.sub("", lines[i]).rstrip())
                i += 1
            out.append(f"{pad}```")
            continue
        literal = _LITERAL.match(line)
        if literal and i + 1 < len(lines) and not lines[i + 1].strip():
            body_at = i + 1
            while body_at < len(lines) and not lines[body_at].strip():
                body_at += 1
            if body_at < len(lines) and _indent(lines[body_at]) > _indent(line):
                pad, words, space = literal.groups()
                if words:  # "text::" reads "text:"; "text ::" reads "text"
                    out.append(f"{pad}{words}{'' if space else ':'}")
                    out.append("")
                end = body_at
                while end < len(lines) and (
                    not lines[end].strip() or _indent(lines[end]) > _indent(line)
                ):
                    end += 1
                while lines[end - 1].strip() == "":
                    end -= 1
                body = lines[body_at:end]
                cut = min(_indent(b) for b in body if b.strip())
                out.append(f"{pad}```")
                out.extend(f"{pad}{b[cut:]}".rstrip() for b in body)
                out.append(f"{pad}```")
                i = end
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


class DocstringsAsMarkdown(griffe.Extension):
    """Rewrites every docstring of a package once it is loaded (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._rewrite(pkg, set())

    def _rewrite(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None:
            obj.docstring.value = as_markdown(obj.docstring.value)
            obj.docstring.__dict__.pop("parsed", None)  # parsed again, from the new text
        for member in obj.members.values():
            if not member.is_alias:
                self._rewrite(member, seen)  # type: ignore[arg-type]
