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

BOM = "\ufeff"  # a UTF-8 byte order mark, decoded: what Windows tools open a file with
_WS = " \t\r\n"
_DECODER = json.JSONDecoder()
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass
class _Value:
    """Where a value lies in the text, and what it reads as."""

    start: int
    end: int
    value: object


def _value_at(text: str, pos: int) -> _Value:
    start = _skip_space(text, pos)
    value, end = _DECODER.raw_decode(text, start)
    return _Value(start, end, value)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WS:
        pos += 1
    return pos


@dataclass
class _Children:
    """One level of a container (of a valid JSON text: no checks): its children, an
    object's each with its key, and `gaps`, the text between its opening bracket, each
    child (a member from its key) and its closing bracket. Only the containers on the way
    to a change are read so, each child read whole by the json module's own scanner."""

    values: list[_Value] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    key_starts: list[int] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    colon: str | None = None  # what stands between its first key and that key's value


def _children(text: str, node: _Value) -> _Children:
    out = _Children()
    after = node.start + 1  # the end of the opening bracket, or of the last child
    pos = _skip_space(text, after)
    while text[pos] not in "]}":
        out.gaps.append(text[after:pos])
        if isinstance(node.value, dict):
            key = _value_at(text, pos)
            out.keys.append(str(key.value))
            out.key_starts.append(pos)
            pos = _skip_space(text, _skip_space(text, key.end) + 1)  # past the colon
            if out.colon is None:
                out.colon = text[key.end : pos]
        child = _value_at(text, pos)
        out.values.append(child)
        after = child.end
        pos = _skip_space(text, after)
        if text[pos] == ",":
            pos = _skip_space(text, pos + 1)
    out.gaps.append(text[after:pos])
    return out


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
    allow_nan=False: never `Infinity`, which the agents cannot read. A UTF-8 byte order
    mark opening `like` opens the result too."""
    if like.startswith(BOM):
        return BOM + render(doc, like.removeprefix(BOM))
    if not like.strip():
        return _fresh(doc, _Style("  ", "\n", ": ", ", "), "", compact=False) + "\n"
    root = _value_at(like, 0)
    colon = (_children(like, root).colon if isinstance(root.value, dict) else None) or ": "
    comma = "," if colon == ":" else ", "  # minified, or as json.dumps writes
    style = _Style(_indent_unit(like), "\r\n" if "\r\n" in like else "\n", colon, comma)
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


def _render(new: object, node: _Value, text: str, style: _Style, compact: bool) -> str:
    if _same(new, node.value):
        return text[node.start : node.end]
    if isinstance(new, dict) and isinstance(node.value, dict):
        kids = _children(text, node)
        # An object naming a key twice (JSON.parse keeps the last) is written anew, whole.
        if len(set(kids.keys)) == len(kids.keys):
            place = {key: i for i, key in enumerate(kids.keys)}
            return _container(node, kids, text, style, compact, list(new.items()), place)
    if isinstance(new, list) and isinstance(node.value, list):
        return _container(node, _children(text, node), text, style, compact, new, None)
    return _fresh(new, style, _line_indent(text, node.start), compact)


def _container(
    node: _Value,
    kids: _Children,
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
    compact = compact if not kids.values else "\n" not in span
    indent = _line_indent(text, node.start)
    if kids.values:
        lead, trail = kids.gaps[0], kids.gaps[-1]
        between = kids.gaps[1] if len(kids.values) > 1 else None
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
            child = kids.values[i]
            head = "" if place is None else text[kids.key_starts[i] : child.start]
            parts.append((i, head + _render(value, child, text, style, compact)))

    if place is not None:
        for key, value in new:
            add(place.get(key), value, key)
    else:
        matcher = difflib.SequenceMatcher(
            None, [_key(v.value) for v in kids.values], [_key(v) for v in new], autojunk=False
        )
        for _, i1, i2, j1, j2 in matcher.get_opcodes():
            for k in range(j2 - j1):  # equal, or replaced pairwise, then the new ones
                add(i1 + k if i1 + k < i2 else None, new[j1 + k], None)
    if not parts:
        return span[0] + span[-1]
    out = [span[0], lead, parts[0][1]]
    for (before, _), (i, part) in zip(parts, parts[1:], strict=False):
        # Two children that stood side by side keep the text that stood between them.
        out += [kids.gaps[i] if i is not None and before == i - 1 else between, part]
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
