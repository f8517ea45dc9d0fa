"""JSON settings text as the user wrote it. `relay install` and `relay uninstall` edit the
agents' settings files, which people keep in dotfiles repositories: `render` writes a new
document in the old text's layout, so the diff shows Relay's entries and nothing else, and
`jsonc_extras` names the comments and trailing commas JSON, and so the agents, refuse.

`render` copies every value that did not change as the file spelled it (indentation, key
order, one-line objects, line ends, escapes, how a number is written, whether the file ends
in a newline); only what changed is written anew, laid out as its neighbours are, and a
member or element that goes takes its separator with it.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any

_WS = " \t\r\n"
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass
class _Node:
    """A value's place in the text. A container's `gaps` are the text between its opening
    bracket, each child (a member from its key, or an element) and its closing bracket."""

    start: int
    end: int = 0
    keys: list[str] = field(default_factory=list)  # an object's, one per child
    key_starts: list[int] = field(default_factory=list)
    children: list[_Node] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)


class _Parser:
    """Where each value of a valid JSON text lies (the text was parsed before: no checks)."""

    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0
        self.colon = ": "  # the file's spelling of what stands between a key and its value

    def _skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in _WS:
            self.pos += 1

    def _skip_string(self) -> None:
        self.pos += 1
        while self.text[self.pos] != '"':
            self.pos += 2 if self.text[self.pos] == "\\" else 1
        self.pos += 1

    def value(self) -> _Node:
        self._skip_ws()
        node = _Node(self.pos)
        first = self.text[self.pos]
        if first in "{[":
            self._container(node, first == "{")
        elif first == '"':
            self._skip_string()
        else:
            while self.pos < len(self.text) and self.text[self.pos] not in _WS + ",]}":
                self.pos += 1
        node.end = self.pos
        return node

    def _container(self, node: _Node, is_object: bool) -> None:
        self.pos += 1
        after = self.pos  # the end of the opening bracket or of the last child
        self._skip_ws()
        while self.text[self.pos] not in "]}":
            node.gaps.append(self.text[after : self.pos])
            if is_object:
                node.key_starts.append(self.pos)
                self._skip_string()
                node.keys.append(json.loads(self.text[node.key_starts[-1] : self.pos]))
                key_end = self.pos
                self._skip_ws()
                self.pos += 1  # the colon
                self._skip_ws()
                if len(node.keys) == 1:
                    self.colon = self.text[key_end : self.pos]
            node.children.append(self.value())
            after = self.pos
            self._skip_ws()
            if self.text[self.pos] == ",":
                self.pos += 1
                self._skip_ws()
        node.gaps.append(self.text[after : self.pos])
        self.pos += 1


@dataclass
class _Style:
    unit: str  # one level of indentation
    nl: str  # the file's line end
    colon: str  # between a key and its value
    comma: str  # between two children on one line


def render(doc: dict[str, Any], like: str = "") -> str:
    """`doc` as JSON text laid out as `like` (a valid JSON text, or "" for a new file: two
    spaces a level, a newline at the end). ensure_ascii=False, but a lone surrogate
    ("\\ud800" is valid JSON) has no UTF-8: it is written as the escape it was read from.
    allow_nan=False: never `Infinity`, which the agents cannot read."""
    if not like.strip():
        return _fresh(doc, _Style("  ", "\n", ": ", ", "), "", compact=False) + "\n"
    parser = _Parser(like)
    root = parser.value()
    nl = "\r\n" if "\r\n" in like else "\n"
    comma = "," if parser.colon == ":" else ", "  # minified, or as json.dumps writes
    style = _Style(_indent_unit(like), nl, parser.colon, comma)
    out = like[: root.start] + _render(doc, root, like, style, compact=False) + like[root.end :]
    # Never hand back text that means anything else than `doc`.
    assert _same(json.loads(out), doc), "json_text.render changed the document"
    return out


def _indent_unit(text: str) -> str:
    # Lines end at "\n": splitlines() would also break inside a string holding U+2028.
    for line in text.split("\n")[1:]:
        stripped = line.lstrip(" \t")
        if stripped and len(stripped) < len(line):
            lead = line[: len(line) - len(stripped)]
            return "\t" if lead.startswith("\t") else " " * len(lead)
    return "  "


def _same(a: object, b: object) -> bool:
    """Equal as JSON: 1, 1.0 and true differ, and so does the order of an object's keys."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _fresh(value: object, style: _Style, indent: str, compact: bool) -> str:
    """`value` written anew, its first line at `indent` (one line when `compact`)."""
    if compact:
        separators = (style.comma, style.colon)
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=separators)
    else:
        text = json.dumps(
            value,
            ensure_ascii=False,
            allow_nan=False,
            indent=style.unit,
            separators=(",", style.colon),
        ).replace("\n", style.nl + indent)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _line_indent(text: str, pos: int) -> str:
    line = text[text.rfind("\n", 0, pos) + 1 : pos]
    return line[: len(line) - len(line.lstrip(" \t"))]


def _render(new: object, node: _Node, text: str, style: _Style, compact: bool) -> str:
    span = text[node.start : node.end]
    if _same(new, json.loads(span)):
        return span
    # An object naming a key twice (JSON.parse keeps the last) is written anew, as a whole.
    if isinstance(new, dict) and span[0] == "{" and len(set(node.keys)) == len(node.keys):
        place = {key: i for i, key in enumerate(node.keys)}
        return _container(node, text, style, compact, list(new.items()), place)
    if isinstance(new, list) and span[0] == "[":
        return _container(node, text, style, compact, new, None)
    return _fresh(new, style, _line_indent(text, node.start), compact)


def _container(
    node: _Node,
    text: str,
    style: _Style,
    compact: bool,
    new: list[Any],
    place: dict[str, int] | None,
) -> str:
    """An object (`new` its items, `place` each old key's child) or an array (`new` its
    elements, matched to the old ones as a diff matches lines) with what did not change
    kept as written."""
    span = text[node.start : node.end]
    compact = compact if not node.children else "\n" not in span
    indent = _line_indent(text, node.start)
    if node.children:
        lead, trail = node.gaps[0], node.gaps[-1]
        between = node.gaps[1] if len(node.children) > 1 else None
    else:
        lead, trail = ("", "") if compact else (style.nl + indent + style.unit, style.nl + indent)
        between = None
    if between is None:
        between = "," + lead if "\n" in lead else style.comma
    child_indent = between[between.rfind("\n") + 1 :] if "\n" in between else indent
    parts: list[tuple[int | None, str]] = []  # (the old child it stands for, its text)

    def add(i: int | None, value: object, key: str | None) -> None:
        if i is None:
            head = "" if key is None else _fresh(key, style, "", True) + style.colon
            parts.append((None, head + _fresh(value, style, child_indent, compact)))
        else:
            child = node.children[i]
            head = "" if place is None else text[node.key_starts[i] : child.start]
            parts.append((i, head + _render(value, child, text, style, compact)))

    if place is not None:
        for key, value in new:
            add(place.get(key), value, key)
    else:
        old = [json.loads(text[c.start : c.end]) for c in node.children]
        matcher = difflib.SequenceMatcher(
            None, [_key(v) for v in old], [_key(v) for v in new], autojunk=False
        )
        for _, i1, i2, j1, j2 in matcher.get_opcodes():
            for k in range(j2 - j1):  # equal, or replaced pairwise, then the new ones
                add(i1 + k if i1 + k < i2 else None, new[j1 + k], None)
    if not parts:
        return span[0] + span[-1]
    out = [span[0], lead, parts[0][1]]
    for (before, _), (i, part) in zip(parts, parts[1:], strict=False):
        # Two children that stood side by side keep the text that stood between them.
        out += [node.gaps[i] if i is not None and before == i - 1 else between, part]
    return "".join([*out, trail, span[-1]])


def _key(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


# -- what JSON refuses ----------------------------------------------------------------
def jsonc_extras(text: str) -> list[tuple[str, str]]:
    """What makes `text` JSON with comments rather than JSON: for each kind, what it is with
    its lines and what to take out ("a comment (line 2)", "the comment"). Empty unless
    taking the comments and trailing commas out leaves valid JSON."""
    comments: list[int] = []  # line numbers
    commas: list[int] = []
    out: list[str] = []  # the text without them
    comma: tuple[int, int] | None = None  # the last comma (in text, in out) until a value
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            end = i + 1
            while end < len(text) and text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            out.append(text[i : end + 1])
            comma = None
            i = end + 1
            continue
        if text.startswith(("//", "/*"), i):
            line = text.startswith("//", i)
            end = text.find("\n", i) if line else text.find("*/", i + 2)
            end = len(text) if end < 0 else end if line else end + 2
            comments.append(text.count("\n", 0, i) + 1)
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
            continue
        if ch in "]}" and comma is not None:
            commas.append(text.count("\n", 0, comma[0]) + 1)
            out[comma[1]] = " "
        if ch == ",":
            comma = (i, len(out))
        elif ch not in _WS:
            comma = None
        out.append(ch)
        i += 1
    if not comments and not commas:
        return []
    try:
        json.loads("".join(out))
    except ValueError:
        return []
    found = []
    for lines, one, many in (
        (comments, ("a comment", "the comment"), ("comments", "the comments")),
        (
            commas,
            ("a comma before a closing bracket", "that comma"),
            ("commas before closing brackets", "those commas"),
        ),
    ):
        if not lines:
            continue
        shown = [str(n) for n in dict.fromkeys(lines)]
        what, remove = one if len(lines) == 1 else many
        where = ("lines " if len(shown) > 1 else "line ") + ", ".join(shown[:5])
        found.append((f"{what} ({where}{', ...' if len(shown) > 5 else ''})", remove))
    return found
