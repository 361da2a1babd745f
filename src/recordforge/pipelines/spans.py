"""Dated and numbered input folders: `{YYYY}`, `{MM}`, `{DD}` and `{SPAN}` in patterns, resolved
to one span as TFX's ExampleGen does, without TFX."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from recordforge.errors import SourceError
from recordforge.files.storage import match

__all__ = ["Span", "has_tokens", "resolve_span", "substitute"]

_TOKENS = {
    "{YYYY}": r"(?P<YYYY>\d{4})",
    "{MM}": r"(?P<MM>\d{2})",
    "{DD}": r"(?P<DD>\d{2})",
    "{SPAN}": r"(?P<SPAN>\d+)",
}


@dataclass(frozen=True)
class Span:
    """The values the tokens take for one span."""

    values: dict[str, str]

    def label(self) -> str:
        if "SPAN" in self.values:
            return self.values["SPAN"]
        return f"{self.values.get('YYYY')}-{self.values.get('MM')}-{self.values.get('DD')}"


def has_tokens(pattern: str) -> bool:
    return any(token in pattern for token in _TOKENS)


def substitute(pattern: str, span: Span) -> str:
    for name, value in span.values.items():
        pattern = pattern.replace("{" + name + "}", value)
    return pattern


def _regex(pattern: str) -> re.Pattern[str]:
    """The pattern as a regex over matched paths: tokens capture, glob wildcards match."""
    out = ""
    i = 0
    while i < len(pattern):
        token = next((t for t in _TOKENS if pattern.startswith(t, i)), None)
        if token:
            name = token[1:-1]
            # A token used twice must take the same value: back-reference the second use.
            out += f"(?P={name})" if f"(?P<{name}>" in out else _TOKENS[token]
            i += len(token)
        elif pattern[i] == "*":
            out += ".*" if pattern.startswith("**", i) else "[^/]*"
            i += 2 if pattern.startswith("**", i) else 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + "$")


def resolve_span(patterns: list[str], span: str) -> Span:
    """`span` is "latest", a date "YYYY-MM-DD", or a span number. With "latest", the greatest span
    (number, else date) among the files the patterns match is chosen."""
    if span != "latest":
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", span):
            yyyy, mm, dd = span.split("-")
            return Span({"YYYY": yyyy, "MM": mm, "DD": dd})
        if span.isdigit():
            return Span({"SPAN": span})
        raise SourceError(f"--span must be latest, YYYY-MM-DD or a number, not {span!r}")
    found: set[tuple[tuple[str, str], ...]] = set()
    for pattern in patterns:
        glob = pattern
        for token in _TOKENS:
            glob = glob.replace(token, "*")
        regex = _regex(pattern)
        for meta in match(glob):
            m = regex.match(meta.path)
            if m:
                found.add(tuple(sorted(m.groupdict().items())))
    if not found:
        raise SourceError(f"no span found: nothing matches {', '.join(patterns)}")

    def order(values: Iterable[tuple[str, str]]) -> tuple[int, ...]:
        d = dict(values)
        return (int(d.get("SPAN", 0)), int(d.get("YYYY", 0)), int(d.get("MM", 0)), int(d.get("DD", 0)))

    return Span(dict(max(found, key=order)))
