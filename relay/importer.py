"""Turn instruction files into memory drafts for `relay import`.

Parsing only: no store, no network. Supported inputs:

- Markdown (`*.md`, `*.markdown`, including `CLAUDE.md` and `AGENTS.md`): one memory per
  section. The heading becomes the title, nested headings are kept as a path
  ("Testing › Fixtures"), text before the first heading is a memory of its own, empty
  sections are skipped, and a `#` inside a fenced code block is never a heading.
- `.cursorrules`: plain text or Markdown. When the file is mostly top-level bullets (or
  numbered rules) it becomes one memory per rule; otherwise one per section.
- `.mdc` (Cursor rule files): a YAML-ish front matter block (`description`, `globs`,
  `alwaysApply`) read without PyYAML, then the body as for `.cursorrules`. The description
  leads the title, each glob becomes a tag `glob:<pattern>`, `alwaysApply: true` the tag
  `always-apply`.
- Any other text file named explicitly (`CONVENTIONS.txt`, `.windsurfrules`): as Markdown.

Which files are read, and the `source` each records, is `relay.import_files`'s part; the
section lives in the title. Ids are derived from the source and the section's heading
path, and for sections that share a path (rules, namesake headings) from their text too,
never from their place (`draft_id`), so re-importing an unchanged file yields the same ids
and bodies, and the store can skip it. Sections longer than `MAX_BODY_CHARS` are split
into parts rather than rejected. A control character the server refuses (NUL, ESC, ...)
is replaced by U+FFFD where it stood, and the draft records it (`replaced`) for the caller
to say: one such character refused the whole import. Those Python reads as whitespace
(0x1C-0x1F, NEL) too: they stand in as other code points while the file is parsed.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePath

from relay.errors import InvalidRequestError
from relay.hygiene import (
    MAX_BODY_CHARS,
    MAX_TAG_CHARS,
    MAX_TITLE_CHARS,
    normalize_text,
    replace_controls,
)
from relay.import_files import RULE_FILE_NAMES, RULE_SUFFIXES, source_for
from relay.secret_scan import find_secrets

TITLE_SEPARATOR = " › "


@dataclass(frozen=True)
class ImportDraft:
    """One memory parsed from a file, before validation and storage."""

    id: str
    title: str | None
    body: str
    source: str
    tags: tuple[str, ...]
    # Those of the memory it continues; none: the import's --audience, or everyone.
    audiences: tuple[str, ...] = ()
    # Control characters of its title, body and tags in the file, each replaced by U+FFFD.
    replaced: tuple[str, ...] = ()


def drafts_from_path(
    path: Path, root: Path | None = None, prefix: str | None = None
) -> list[ImportDraft]:
    """Parse one file into memory drafts, in document order."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise InvalidRequestError(f"{path} is not UTF-8 text", path=str(path)) from None
    except OSError as exc:
        raise InvalidRequestError(f"cannot read {path}: {exc.strerror}", path=str(path)) from exc
    if text.count("\0") * 10 > len(text):  # UTF-16 text (half NULs) or binary data, read
        raise InvalidRequestError(  # as UTF-8: each NUL would become a U+FFFD in a memory
            f"{path} is not UTF-8 text (one character in {len(text) // text.count(chr(0))} is"
            " a NUL: binary data, or UTF-16 text)",
            path=str(path),
        )
    source = source_for(path, root, prefix)
    return drafts_from_text(text, source, rules=is_rule_file(path))


def is_rule_file(path: PurePath) -> bool:
    """A bullet-style rule file (`.cursorrules`, `.mdc`): one memory per rule."""
    return path.name in RULE_FILE_NAMES or path.suffix.lower() in RULE_SUFFIXES


def drafts_from_text(text: str, source: str, *, rules: bool = False) -> list[ImportDraft]:
    """Parse file contents into drafts; `rules` reads bullet-style rule files one rule each."""
    # A page break (form feed, ^L in older text files) or a vertical tab is whitespace to
    # a reader of a text file: kept, it is a control character the server refuses wherever
    # it stands, and one refused the whole import. A space, not a line break, so a file
    # that imported before reads the same (at a line's end, the space is trimmed).
    text = text.replace("\f", " ").replace("\v", " ")
    stand_ins = _stand_ins(text)
    text = text.translate({ord(ch): held for ch, held in stand_ins.items()})
    back = {ord(held): ch for ch, held in stand_ins.items()}
    meta, body = split_front_matter(normalize_text(text))
    context = _title_context(meta)
    tags, in_tags = _visible_tags(_front_matter_tags(meta), back)
    sections = split_sections(body)
    if rules and _is_bullet_style(sections):
        units = [unit for section in sections for unit in _rule_units(section)]
    else:
        units = sections
    drafts: list[ImportDraft] = []
    # Counted before empty units are skipped, so filling in an empty section later does not
    # change the ids of the sections that share its heading.
    namesakes = Counter(heading_path for heading_path, _ in units)
    twins: Counter[tuple[tuple[str, ...], str]] = Counter()
    for heading_path, unit_body in units:
        unit_body = normalize_text(unit_body)
        if not unit_body.strip():
            continue
        own_text: str | None = None  # what names it among namesakes
        twin = 0
        if namesakes[heading_path] > 1:
            own_text, twin = unit_body.translate(back), twins[heading_path, unit_body]
            twins[heading_path, unit_body] += 1
        parts = split_long(unit_body, MAX_BODY_CHARS)
        named_by = tuple(heading.translate(back) for heading in heading_path)
        for number, part in enumerate(parts, start=1):
            title, in_title = replace_controls(
                (_title(context, heading_path, number if len(parts) > 1 else None) or "").translate(
                    back
                )
            )
            part, in_body = replace_controls(part.translate(back))
            drafts.append(
                ImportDraft(
                    id=draft_id(source, named_by, number, own_text, twin),
                    title=title or None,
                    body=part,
                    source=source,
                    tags=tags,
                    replaced=(*in_title, *in_body, *in_tags),
                )
            )
    return drafts


# Control characters Python reads as whitespace (str.split, strip and rstrip; splitlines
# breaks lines at three of them). Parsed as they stand, one at a line's end was dropped and
# one in a heading became a space, unsaid, where any other becomes U+FFFD and is said; so
# while a file is parsed, each stands in as a code point it lacks (`_stand_ins`).
SPACE_LIKE_CONTROLS = "\x1c\x1d\x1e\x1f\x85"


def _stand_ins(text: str) -> dict[str, str]:
    """For each of SPACE_LIKE_CONTROLS `text` holds, a private-use code point it does not:
    no whitespace, nothing Markdown reads, given back before the controls are replaced."""
    held = [ch for ch in SPACE_LIKE_CONTROLS if ch in text]
    free = (chr(point) for point in range(0xF0000, 0xFFFFE) if chr(point) not in text)
    return dict(zip(held, free, strict=False))


def _visible_tags(tags: tuple[str, ...], back: dict[int, str]) -> tuple[tuple[str, ...], list[str]]:
    """`tags` with their stand-ins given `back` and their control characters replaced
    (`replace_controls`), and those."""
    found: list[str] = []
    visible = []
    for tag in tags:
        tag, in_tag = replace_controls(tag.translate(back))
        visible.append(tag)
        found += in_tag
    return tuple(dict.fromkeys(visible)), found


def draft_id(
    source: str,
    heading_path: tuple[str, ...],
    part: int = 1,
    text: str | None = None,
    twin: int = 0,
) -> str:
    """A stable id: same file, same section, same id on every import.

    A section alone under its heading path is named by that path, so an edit keeps its id
    and makes a new revision. One that shares its path with others (the rules of a rule
    file, two `## Notes` sections) is named by its `text` too, `twin` counting identical
    ones before it: a place among namesakes would hand each one's id to the next when one
    before it is removed. Part 1 of a split section keeps the id the whole section had, so a
    section that grows past the size limit keeps its memory and gains new ones for the extra
    parts. (`import_writer.continued_ids` then keeps a section's memory across moves and
    edits that change these.)
    """
    key = f"{source}\0{TITLE_SEPARATOR.join(heading_path)}\0"
    if text is None:
        key += "0"  # what a section alone under its path has always had
    else:
        key += f"text {hashlib.sha256(text.encode('utf-8')).hexdigest()}\0{twin}"
    if part > 1:
        key += f"\0part {part}"
    return "imp_" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def draft_label(draft: ImportDraft, ordinal: int) -> str:
    """The file and section a draft came from, as `CLAUDE.md › Ops › CI token`; an untitled
    rule or part by its place in the file (`.cursorrules › rule 3`), never by its text,
    which may hold the secret being refused, and so is one whose title holds a secret (a
    token pasted into a heading): the refusal of that title would print it."""
    title = draft.title if draft.title and not find_secrets(draft.title) else None
    section = title or f"{'rule' if is_rule_file(PurePath(draft.source)) else 'part'} {ordinal}"
    # Quoted when it holds a line break (a file named so): an error about it stays one line.
    source = draft.source if draft.source.isprintable() else repr(draft.source)
    return TITLE_SEPARATOR.join((source, section))


def _title(context: str | None, heading_path: tuple[str, ...], part: int | None) -> str | None:
    names = [context] if context else []
    names += [h for h in heading_path if h]
    suffix = f" (part {part})" if part else ""
    if not names:
        return f"Part {part}" if part else None
    title = TITLE_SEPARATOR.join(names)
    room = MAX_TITLE_CHARS - len(suffix)
    if len(title) > room:
        title = title[: room - 1].rstrip() + "…"
    return title + suffix


# --- front matter ----------------------------------------------------------------------------

_FM_KEY = re.compile(r"^([A-Za-z_][\w-]*)[ \t]*:(.*)$")


def split_front_matter(text: str) -> tuple[dict[str, str | list[str]], str]:
    """Split a leading `---` ... `---` block into a flat dict of strings and string lists.

    Handles what rule files use: `key: value` (quoted or not), flow lists `[a, b]`, block
    lists of `- item` lines, and `|`/`>` block scalars; other keys' values are ignored.
    Without a closing `---`, or with a line between the fences that is none of those (a
    Markdown file that opens with a `---` rule and a paragraph), the text has no front
    matter: reading it as such would drop that text from the import.
    """
    lines = text.split("\n")
    if not lines or lines[0].strip() != "---":
        return {}, text
    end = next((i for i in range(1, len(lines)) if lines[i].strip() in ("---", "...")), None)
    if end is None:
        return {}, text
    meta: dict[str, str | list[str]] = {}
    key: str | None = None
    for line in lines[1:end]:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        m = _FM_KEY.match(line)
        if m and not line[0].isspace():
            key, value = m.group(1), m.group(2).strip()
            if value in ("|", ">", "|-", ">-", "|+", ">+"):
                meta[key] = ""
            elif value.startswith("[") and value.endswith("]"):
                meta[key] = [_unquote(v) for v in _split_top_level(value[1:-1]) if v.strip()]
            else:
                meta[key] = _unquote(value)
            continue
        if key is None:
            return {}, text
        current = meta[key]
        if stripped.startswith("- ") and (current == "" or isinstance(current, list)):
            items = current if isinstance(current, list) else []
            items.append(_unquote(stripped[2:]))
            meta[key] = items
        elif isinstance(current, str) and line[0].isspace():
            meta[key] = f"{current} {stripped}".strip()  # block scalar or wrapped value
        else:
            return {}, text
    return meta, "\n".join(lines[end + 1 :])


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def _split_top_level(value: str) -> list[str]:
    """Split on commas outside braces and brackets: `src/*.{ts,tsx}, lib/*.js` is two globs."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in value:
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    parts.append("".join(current).strip())
    return [p for p in parts if p]


def _title_context(meta: dict[str, str | list[str]]) -> str | None:
    value = meta.get("description") or meta.get("title")
    if not isinstance(value, str) or not value.strip():
        return None
    context = " ".join(value.split())
    return context if len(context) <= 80 else context[:79].rstrip() + "…"


def _front_matter_tags(meta: dict[str, str | list[str]]) -> tuple[str, ...]:
    raw = meta.get("globs")
    if isinstance(raw, str):
        raw = _split_top_level(raw)
    tags: dict[str, None] = {}
    for glob in raw or ():
        glob = _unquote(glob)
        tag = f"glob:{glob}"
        # A tag holds no whitespace; a glob that cannot be a tag is dropped, not mangled.
        if glob and not any(ch.isspace() for ch in glob) and len(tag) <= MAX_TAG_CHARS:
            tags.setdefault(tag, None)
    if str(meta.get("alwaysApply", "")).strip().lower() in ("true", "yes", "on"):
        tags.setdefault("always-apply", None)
    return tuple(tags)


# --- Markdown sections -----------------------------------------------------------------------

_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_SETEXT = re.compile(r"^ {0,3}(?:={3,}|-{3,})[ \t]*$")
_BULLET = re.compile(r"^([ \t]*)(?:[-*+]|\d{1,3}[.)])[ \t]+(?=\S)")
_BLOCK_START = re.compile(r"^ {0,3}(?:[>|]|[-*+][ \t]|\d{1,3}[.)][ \t]|<)")

Section = tuple[tuple[str, ...], str]


def _code_mask(lines: list[str]) -> list[bool]:
    """For each line, whether it is part of a fenced code block (fences included)."""
    mask: list[bool] = []
    fence: str | None = None
    for line in lines:
        m = _FENCE.match(line)
        if fence is not None:
            mask.append(True)
            # A closing fence: same character, at least as long, nothing after it.
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None if not m.group(2).strip() else fence
            continue
        if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
            fence = m.group(1)
            mask.append(True)
        else:
            mask.append(False)
    return mask


def _clean_heading(text: str) -> str:
    text = " ".join(text.split())
    for marker in ("**", "__"):
        if len(text) > 4 and text.startswith(marker) and text.endswith(marker):
            text = text[2:-2].strip()
    return text


def split_sections(text: str) -> list[Section]:
    """Split Markdown into (heading path, body) pairs in document order, preamble first.

    ATX (`## x`) and setext (`x` over `===`/`---`) headings start sections; fenced code is
    opaque. Bodies exclude their heading line and may be empty.
    """
    lines = text.split("\n")
    code = _code_mask(lines)
    sections: list[Section] = []
    stack: list[tuple[int, str]] = []
    body: list[str] = []

    def flush() -> None:
        sections.append((tuple(h for _, h in stack), "\n".join(body)))
        body.clear()

    for i, line in enumerate(lines):
        if code[i]:
            body.append(line)
            continue
        m = _ATX.match(line)
        if m:
            level, heading = len(m.group(1)), _clean_heading(m.group(2) or "")
        elif (
            _SETEXT.match(line)
            and body
            and body[-1].strip()
            and not code[i - 1]
            and not _BLOCK_START.match(body[-1])
            and (len(body) == 1 or not body[-2].strip())
        ):
            level, heading = (1 if line.strip()[0] == "=" else 2), _clean_heading(body.pop())
        else:
            body.append(line)
            continue
        flush()
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, heading))
    flush()
    return sections


# --- rule files ------------------------------------------------------------------------------


def _is_bullet_style(sections: list[Section]) -> bool:
    """Whether most blocks outside code and headings are top-level bullets (or numbered rules)."""
    bullets = others = 0
    for _, body in sections:
        lines = body.split("\n")
        code = _code_mask(lines)
        top = _top_indent(lines, code)
        previous_blank = True
        for line, in_code in zip(lines, code, strict=True):
            if in_code or not line.strip():
                previous_blank = not in_code
                continue
            m = _BULLET.match(line)
            if m:
                bullets += len(m.group(1).expandtabs(4)) == top  # nested bullets belong to a rule
            elif previous_blank:
                others += 1
            previous_blank = False
    return bullets >= 2 and bullets >= others


def _top_indent(lines: list[str], code: list[bool]) -> int | None:
    indents = [
        len(m.group(1).expandtabs(4))
        for line, in_code in zip(lines, code, strict=True)
        if not in_code and (m := _BULLET.match(line))
    ]
    return min(indents) if indents else None


def _rule_units(section: Section) -> list[Section]:
    """Split one section of a bullet-style rule file into one unit per top-level rule.

    Continuation lines and nested bullets stay with their rule, as does a code block that
    follows it. A short line introducing a list ("Error Handling", "Testing:") is a label
    for the rules under it, like a heading, until a paragraph follows the list; other
    paragraphs are units of their own.
    """
    path, body = section
    lines = body.split("\n")
    code = _code_mask(lines)
    top = _top_indent(lines, code)
    blocks: list[tuple[str, list[str]]] = []  # ("bullet" | "para", lines)
    marker_width = 0
    blank_before = True
    for line, in_code in zip(lines, code, strict=True):
        if in_code:
            if not blocks:
                blocks.append(("para", []))
            if blocks[-1][0] == "bullet" and line[:marker_width].isspace():
                line = line[marker_width:]  # a code block indented under its rule
            blocks[-1][1].append(line)
            blank_before = False
            continue
        if not line.strip():
            if blocks:
                blocks[-1][1].append("")
            blank_before = True
            continue
        m = _BULLET.match(line)
        indent = len(line) - len(line.lstrip(" \t"))
        if m and top is not None and len(m.group(1).expandtabs(4)) == top:
            marker_width = m.end()
            blocks.append(("bullet", [line[m.end() :]]))
        elif blocks and blocks[-1][0] == "bullet" and (indent > (top or 0)):
            blocks[-1][1].append(line[marker_width:] if indent >= marker_width else line.lstrip())
        elif blocks and blocks[-1][0] == "para" and not blank_before:
            blocks[-1][1].append(line)
        else:
            blocks.append(("para", [line]))
        blank_before = False

    units: list[Section] = []
    label: tuple[str, ...] = ()
    for i, (kind, block) in enumerate(blocks):
        text = "\n".join(block).strip("\n")
        if not text.strip():
            continue
        next_is_bullet = i + 1 < len(blocks) and blocks[i + 1][0] == "bullet"
        if kind == "para" and next_is_bullet and _is_label(text):
            label = (_clean_heading(text.strip().rstrip(":").strip()),)
            continue
        if kind == "para" and i > 0 and blocks[i - 1][0] == "bullet":
            label = ()  # a paragraph after a list ends the list its label introduced
        units.append((path + label, text))
    return units


def _is_label(text: str) -> bool:
    line = text.strip()
    return (
        "\n" not in line
        and len(line) <= 80
        and not line.endswith((".", "!", "?", "`"))
        and not _FENCE.match(line)
    )


# --- size ------------------------------------------------------------------------------------


def split_long(body: str, limit: int = MAX_BODY_CHARS) -> list[str]:
    """Split `body` into parts of at most `limit` characters.

    Cuts fall between paragraphs where possible (never inside a fenced code block that
    fits), then between lines, then inside a line between words, and only as a last resort
    inside a word.
    """
    if len(body) <= limit:
        return [body]
    lines = body.split("\n")
    code = _code_mask(lines)
    blocks: list[str] = []
    current: list[str] = []
    for line, in_code in zip(lines, code, strict=True):
        if not line.strip() and not in_code and current:
            blocks.append("\n".join(current))
            current = []
        elif line.strip() or in_code:
            current.append(line)
    if current:
        blocks.append("\n".join(current))

    pieces: list[tuple[str, str]] = []  # (separator before it, text)
    for block in blocks:
        if len(block) <= limit:
            pieces.append(("\n\n", block))
            continue
        separator = "\n\n"
        for line in block.split("\n"):
            for chunk in _cut_line(line, limit):
                pieces.append((separator, chunk))
                separator = "\n"

    parts: list[str] = []
    current_part = ""
    for separator, piece in pieces:
        candidate = f"{current_part}{separator}{piece}" if current_part else piece
        if len(candidate) <= limit:
            current_part = candidate
        else:
            parts.append(current_part)
            current_part = piece
    if current_part:
        parts.append(current_part)
    return [normalize_text(p) for p in parts if p.strip()]


def _cut_line(line: str, limit: int) -> list[str]:
    """`line` in chunks of at most `limit` characters, cut after a space where one is in the
    second half of the chunk (a word cut in two is found by neither half's search)."""
    chunks: list[str] = []
    while len(line) > limit:
        cut = line.rfind(" ", limit // 2, limit) + 1 or limit
        chunks.append(line[:cut])
        line = line[cut:]
    chunks.append(line)
    return chunks
