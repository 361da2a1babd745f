"""Which local files an input pattern matches, by the rules Beam's local filesystem matches them
(so `infer-schema` and `convert` see the same files), without importing Beam."""

from __future__ import annotations

import os
import re

__all__ = ["local_matches"]

_GLOB = re.compile(r"[\[*?]")


def local_matches(pattern: str) -> list[str]:
    """The paths `pattern` (an absolute local path) matches, sorted, as Beam's filesystems give
    them: `*` within one path segment, `**` across segments, `?` any one character,
    `[...]` (`[!...]` negated) a class; the files below the folder in front of the first glob
    character are searched at any depth, hidden files included; a pattern ending in `/` is that
    folder's files; a pattern without glob characters is that path, if it exists."""
    if pattern.endswith("/"):
        pattern += "*"
    first = _GLOB.search(pattern)
    if first is None:
        return [pattern] if os.path.exists(pattern) else []
    regex = re.compile(_translate(pattern), re.DOTALL | re.MULTILINE)
    found = []
    for folder, _, names in os.walk(os.path.dirname(pattern[: first.start()])):
        for name in names:
            path = os.path.join(folder, name)
            if regex.match(path) and os.path.exists(path):
                found.append(path)
    return sorted(found)


def _translate(pattern: str) -> str:
    """The regular expression for a whole path matching `pattern`."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        i += 1
        if c == "*":
            if pattern[i : i + 1] == "*":
                out.append(".*")
                i += 1
            else:
                out.append(r"[^/\\]*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            end = i + (pattern[i : i + 1] == "!")
            end += pattern[end : end + 1] == "]"  # a leading ] is a member, not the end
            end = pattern.find("]", end)
            if end < 0:
                out.append(r"\[")
                continue
            members = pattern[i:end].replace("\\", "\\\\")
            i = end + 1
            if members.startswith("!"):
                members = "^" + members[1:]
            elif members.startswith("^"):
                members = "\\" + members
            out.append(f"[{members}]")
        else:
            out.append(re.escape(c))
    return "".join(out) + r"\Z"
