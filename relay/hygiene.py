"""Write hygiene: what a memory write must pass before anything is stored.

Every check either returns the normalised value or raises a Relay error that
names the problem, so the API, the CLI and `relay import` reject the same
things with the same words. Pure and stdlib-only: no I/O, no store, no clock
unless the caller passes none.

Secret-shaped content is found by `relay.secret_scan` (its docstring says how)
and refused here, in every field a write carries.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Collection, Iterable
from datetime import UTC, datetime

from relay.errors import InvalidRequestError, SecretDetectedError, TooLargeError
from relay.secret_scan import find_secrets

MAX_BODY_CHARS = 16_000
MAX_TITLE_CHARS = 200
MAX_KEY_NAME_CHARS = 200
MAX_SOURCE_CHARS = 300
MAX_TAGS = 32
MAX_TAG_CHARS = 100
MAX_AUDIENCES = 32
MAX_ROLES = 64  # of one key
EVERYONE = "all"  # the audience that means everyone in the org (same value as relay.models)

_AUDIENCE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
_CONTROL_OR_TAB = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# C0 controls but tab and line breaks, DEL, and C1 controls: never meaningful in a memory,
# and terminal escape sequences must not ride into an agent's context. Refused wherever
# they stand, judged in a value as written: Python's strip() and rstrip() take 0x1C-0x1F,
# a form feed, a vertical tab and NEL for whitespace, so at a line's or a value's end they
# were dropped unsaid where inside they were refused. Tab and line breaks (a carriage
# return is one) are not: the rule for each field says where.
_CONTROL_ANYWHERE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# What breaks a line that a control does not: a newline, a carriage return (alone, or as
# CRLF's first half), and Unicode's line and paragraph separators. A title and a source
# are one line; at their ends these are whitespace, trimmed.
_LINE_BREAK = re.compile("[\n\r\u2028\u2029]")
_ONE_LINE = "{what} must be one line, without a line break ({{found}})"
# A surrogate code point on its own: JSON can spell one ("\ud800"), no encoder takes it.
_SURROGATE = re.compile("[\ud800-\udfff]")


# --- normalisation -----------------------------------------------------------------------


def normalize_text(text: str) -> str:
    """Newlines as `\\n`, no trailing whitespace on any line, no leading or trailing blank lines.

    Leading indentation is kept: it is meaningful in Markdown (code blocks, nested lists).
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = [line.rstrip() for line in text.split("\n")]
    return "\n".join(lines).strip("\n")


def replace_controls(text: str) -> tuple[str, list[str]]:
    """`text` with each control character a body or title may not hold replaced by U+FFFD
    (the replacement character: something was here), and those replaced, in order."""
    found = _CONTROL_ANYWHERE.findall(text)
    return (_CONTROL_ANYWHERE.sub("\ufffd", text) if found else text), found


# --- field checks --------------------------------------------------------------------------


# Letters that show as nothing: the Hangul fillers and the braille blank.
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def is_blank(text: str) -> bool:
    """Whether `text` shows a reader nothing: whitespace, invisible format characters
    (zero-width spaces, joiners, bidi marks), combining marks with nothing to mark, and
    letters drawn blank. Such a body, title, source or tag could be stored but never read."""
    return all(
        ch.isspace() or ch in _BLANK_LETTERS or unicodedata.category(ch) in ("Cf", "Mn", "Me")
        for ch in text
    )


def unpaired_surrogate(text: str) -> str | None:
    """What is wrong with `text` if it holds a lone UTF-16 surrogate (not Unicode text,
    and unstorable), else None."""
    found = _SURROGATE.search(text)
    if found is None:
        return None
    return (
        f"contains an unpaired surrogate (\\u{ord(found.group()):04x}) at character "
        f"{found.start()}, which is not Unicode text"
    )


def surrogate_in(value: object, root: str = "the value") -> tuple[str, str] | None:
    """(where, the string) of the first string in `value` (a string, or lists and objects
    of them, keys included) holding a lone surrogate, or None. `where` is a path
    (`params.query`, `items[2]`; "" for `value` itself), or `a key in PATH` (`root` for
    `value`'s own keys). Walked without recursion: json.loads nests deeper than a recursive
    walk could go."""
    stack: list[tuple[object, str]] = [(value, "")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return where, item
        elif isinstance(item, dict):
            values = [(v, f"{where}.{k}" if where else str(k)) for k, v in item.items()]
            keys = [(k, f"a key in {where or root}") for k in item]
            stack.extend(reversed(keys + values))
        elif isinstance(item, list | tuple):
            stack.extend(reversed([(v, f"{where}[{i}]") for i, v in enumerate(item)]))
    return None


def check_filter(name: str, value: str | None) -> str | None:
    """A list filter's value (`source`, `source_prefix`, `tag`, `q`): no stored value has control
    characters, and PostgreSQL refuses a NUL in a query where SQLite matched nothing, so one
    is refused (422, like any malformed parameter) the same on both stores; one longer than
    any stored value can be is 413, as every text over its limit is."""
    if value is None:
        return value
    if _CONTROL_OR_TAB.search(value):
        error = InvalidRequestError(f"{name} must not contain control characters", field=name)
        error.status = 422
        raise error
    limit = MAX_TAG_CHARS if name == "tag" else MAX_SOURCE_CHARS
    if len(value) > limit:
        raise TooLargeError(
            f"{name} is {len(value)} characters; the limit is {limit}", field=name, limit=limit
        )
    return value


def _check_unicode(text: str, field: str, what: str | None = None) -> None:
    problem = unpaired_surrogate(text)
    if problem:
        raise InvalidRequestError(f"{what or field} {problem}", field=field)


def _refuse_controls(
    text: str,
    field: str,
    message: str,
    controls: re.Pattern[str] = _CONTROL_ANYWHERE,
    offset: int = 0,
) -> None:
    """Raise if `text` holds one of `controls`: `message`, its `{found}` the first one's code
    point and place in the value as it was sent (`offset`: where `text` starts in it)."""
    hit = controls.search(text)
    if hit is None:
        return
    code_point = f"U+{ord(hit.group()):04X}"
    raise InvalidRequestError(
        message.format(found=f"{code_point} at character {offset + hit.start()}"),
        field=field,
        code_point=code_point,
    )


def _quoted(text: str) -> str:
    """`text` for a message: escaped, so what it holds shows, and its first 40 characters."""
    return ascii(text) if len(text) <= 40 else ascii(text[:40]) + "..."


def _trimmed(name: str) -> str:
    """An audience or a role without the whitespace at its ends, unless it holds a control
    character: then as written, so its name rule refuses it at an end as inside (strip()
    would have taken 0x1C-0x1F, a form feed, a vertical tab or NEL away unsaid)."""
    return name if _CONTROL_ANYWHERE.search(name) else name.strip()


_SPELLING_FORMAT_CHARACTERS = frozenset("\u200c\u200d\u00ad")


def _refuse_format_characters(text: str, field: str, what: str) -> None:
    """Raise if path-like `text` (a source, a tag) holds a Unicode format character: one that
    shows as nothing yet changes what is shown. A bidi override or isolate (U+202A-U+202E,
    U+2066-U+2069) reorders what follows it (`ops/\u202efdp.exe` shows as `ops/exe.pdf`);
    a zero-width character or a tag character (U+E0000 on) hides text that an agent still
    reads. A title or body keeps them: right-to-left prose needs its marks. The joiners
    (U+200C, U+200D) and the soft hyphen stay allowed: Persian and Indic words and emoji
    sequences (a tag such as 👩‍💻) are spelled with them, and they reorder nothing."""
    for at, ch in enumerate(text):
        if unicodedata.category(ch) == "Cf" and ch not in _SPELLING_FORMAT_CHARACTERS:
            name = unicodedata.name(ch, "a format character")
            raise InvalidRequestError(
                f"{what} contains U+{ord(ch):04X} ({name}) at character {at}, an invisible "
                "character that changes how the text shows; remove it",
                field=field,
                code_point=f"U+{ord(ch):04X}",
            )


def check_format_characters(
    source: str | None,
    tags: Iterable[str],
    held_source: str | None = None,
    held_tags: Collection[str] = (),
) -> None:
    """Raise if a memory's source or a tag, as `check_source` and `check_tags` return them,
    holds an invisible format character (`_refuse_format_characters`), or the source a line
    or paragraph separator (U+2028, U+2029: a source is one line, and a tag holds no
    whitespace at all), and is not one the memory holds already (`held_source`,
    `held_tags`: as stored). One stored before the rule (by an older release) is not judged
    again: every write of that memory was refused, an edit of its body alone too, until the
    writer also fixed a field the edit never named. It may be kept, never newly given: by a
    create, a restore into another organisation, an edit that sets it. The store judges it
    (`rules.judge_format_characters`), where the memory a write replaces is read."""
    if source is not None and source != held_source:
        _refuse_controls(source, "source", _ONE_LINE.format(what="source"), _LINE_BREAK)
        _refuse_format_characters(source, "source", "source")
    for tag in tags:
        if tag not in held_tags:
            _refuse_format_characters(tag, "tags", f"tag {ascii(tag)}")


def check_body(body: str) -> str:
    """Return the normalised body, or raise if it is empty, oversized or secret-shaped."""
    if not isinstance(body, str):
        raise InvalidRequestError("body must be a string", field="body")
    _check_unicode(body, "body")
    _refuse_controls(
        body,
        "body",
        "body contains control characters (terminal escape codes or binary data): {found}",
    )
    body = normalize_text(body)
    if is_blank(body):
        raise InvalidRequestError("body is empty; a memory needs some text", field="body")
    if len(body) > MAX_BODY_CHARS:
        raise TooLargeError(
            f"body is {len(body):,} characters; the limit is {MAX_BODY_CHARS:,} "
            "(split it into several memories)",
            field="body",
            limit=MAX_BODY_CHARS,
        )
    _reject_secrets(body, "memory", "body")
    return body


def check_key_name(name: str) -> None:
    """Raise unless `name` can name a key: one line of plain text, up to MAX_KEY_NAME_CHARS."""
    if not name.strip():
        raise InvalidRequestError("a key needs a name (who or what holds it)", field="name")
    check_name(name, "alice laptop")


def check_name(name: str, example: str) -> None:
    """Raise unless `name` can name a key or an organisation: one line of plain text, up to
    MAX_KEY_NAME_CHARS, no secret (listed wherever what it names is)."""
    if len(name) > MAX_KEY_NAME_CHARS:
        raise TooLargeError(
            f"name is {len(name):,} characters; the limit is {MAX_KEY_NAME_CHARS}",
            field="name",
            limit=MAX_KEY_NAME_CHARS,
        )
    if _CONTROL_OR_TAB.search(name):
        raise InvalidRequestError(
            f"name must be one line without control characters, like {example!r}",
            field="name",
        )
    # Shown by `relay key list` and `org list`, the console and whoami, beside what it names.
    _reject_secrets(name, "name", "name")


def check_given_id(memory_id: str) -> str:
    """Raise if a memory id chosen by the writer (the API's `id`, a batch item's, an
    import's) is secret-shaped: an id is shown wherever its memory is (search results, the
    hook's context, exports), so it is refused as the same text in a body would be."""
    _reject_secrets(memory_id, "id", "id")
    return memory_id


def check_title(title: str | None) -> str | None:
    """Return the title with its whitespace runs collapsed to one space; None or blank
    means no title. A title is a one-line label (a heading in an import, one line in the
    console): a line break inside it, CR, LF or CRLF alike, is refused, never made a space
    unsaid; at its ends, as any whitespace, it is trimmed."""
    if title is None:
        return None
    if not isinstance(title, str):
        raise InvalidRequestError("title must be a string", field="title")
    _check_unicode(title, "title")
    _refuse_controls(title, "title", "title contains control characters: {found}")
    collapsed = " ".join(title.split())
    if is_blank(collapsed):
        return None
    if len(collapsed) > MAX_TITLE_CHARS:
        raise TooLargeError(
            f"title is {len(collapsed):,} characters; the limit is {MAX_TITLE_CHARS}",
            field="title",
            limit=MAX_TITLE_CHARS,
        )
    _reject_secrets(collapsed, "title", "title")  # first: a private key spans lines
    trimmed = len(title) - len(title.lstrip())
    _refuse_controls(title.strip(), "title", _ONE_LINE.format(what="title"), _LINE_BREAK, trimmed)
    return collapsed


def check_source(source: str | None) -> str | None:
    """Return the path-like provenance, stripped; None or blank means no source. Its format
    characters and line separators are judged against the memory's own
    (`check_format_characters`)."""
    if source is None:
        return None
    if not isinstance(source, str):
        raise InvalidRequestError("source must be a string", field="source")
    _check_unicode(source, "source")
    one_line = "source must be one line without control characters ({found}), like docs/deploy.md"
    _refuse_controls(source, "source", one_line)
    trimmed = len(source) - len(source.lstrip())
    source = source.strip()
    if is_blank(source):
        return None
    _refuse_controls(source, "source", one_line, _CONTROL_OR_TAB, trimmed)  # a tab, a break
    if len(source) > MAX_SOURCE_CHARS:
        raise TooLargeError(
            f"source is {len(source)} characters; the limit is {MAX_SOURCE_CHARS}",
            field="source",
            limit=MAX_SOURCE_CHARS,
        )
    _reject_secrets(source, "source", "source")
    return source


def check_tags(tags: Iterable[str] | None) -> tuple[str, ...]:
    """Return the tags stripped and de-duplicated in first-seen order.

    Case is kept: tags such as `glob:src/**/*.TS` are case-sensitive. Their format
    characters are judged against the memory's own (`check_format_characters`).
    """
    if tags is None:
        return ()
    tags = [tags] if isinstance(tags, str) else list(tags)
    # As written, before a message below repeats a tag.
    _reject_secrets(" ".join(t for t in tags if isinstance(t, str)), "tags", "tags")
    out: dict[str, None] = {}
    for tag in tags:
        if not isinstance(tag, str):
            raise InvalidRequestError("tags must be strings", field="tags")
        _check_unicode(tag, "tags", "a tag")
        _refuse_controls(tag, "tags", f"tag {_quoted(tag)} contains control characters: {{found}}")
        tag = tag.strip()
        if is_blank(tag):
            raise InvalidRequestError("tags must not be empty or invisible", field="tags")
        if len(tag) > MAX_TAG_CHARS:
            raise TooLargeError(
                f"tag {tag[:40]!r}... is {len(tag)} characters; the limit is {MAX_TAG_CHARS}",
                field="tags",
                limit=MAX_TAG_CHARS,
            )
        if any(ch.isspace() for ch in tag) or _CONTROL_OR_TAB.search(tag):
            raise InvalidRequestError(
                f"tag {tag!r} contains whitespace or control characters", field="tags"
            )
        out.setdefault(tag, None)
    if len(out) > MAX_TAGS:
        raise TooLargeError(
            f"{len(out)} tags; the limit is {MAX_TAGS}", field="tags", limit=MAX_TAGS
        )
    return tuple(out)


def check_audiences(
    audiences: Iterable[str] | str | None, allowed: set[str] | None = None
) -> tuple[str, ...]:
    """Return the audiences lower-cased, de-duplicated and sorted; `all` absorbs the rest.

    `allowed` is the set of audiences known in the org; when given, any other name is
    rejected (a typo would otherwise hide a memory from everyone). `all` is always allowed.
    """
    if audiences is None:
        raise InvalidRequestError(
            "audiences must name at least one role, or 'all' for everyone", field="audiences"
        )
    audiences = [audiences] if isinstance(audiences, str) else list(audiences)
    # As written, before any message repeats one; a restore or an import names any.
    _reject_secrets(" ".join(a for a in audiences if isinstance(a, str)), "audiences", "audiences")
    names: set[str] = set()
    for name in audiences:
        if not isinstance(name, str):
            raise InvalidRequestError("audiences must be strings", field="audiences")
        name = _trimmed(name).lower()
        if not _AUDIENCE.fullmatch(name):
            raise InvalidRequestError(
                f"audience {name!r} is not a valid name "
                "(lowercase letters, digits, '_', '.', '-'; at most 64 characters)",
                field="audiences",
            )
        names.add(name)
    if not names:
        raise InvalidRequestError(
            "audiences must name at least one role, or 'all' for everyone", field="audiences"
        )
    if len(names) > MAX_AUDIENCES:
        raise TooLargeError(
            f"{len(names)} audiences; the limit is {MAX_AUDIENCES}",
            field="audiences",
            limit=MAX_AUDIENCES,
        )
    if allowed is not None:
        unknown = sorted(names - set(allowed) - {EVERYONE})
        if unknown:
            # Nobody could read it: an audience is a role that some live key carries.
            raise InvalidRequestError(
                f"unknown audience{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)} (no "
                "live key has that role; an admin creates one first, e.g. relay key create"
                f" --org ORG --name NAME --scope memory:read --role {unknown[0]})",
                field="audiences",
                unknown=unknown,
            )
    if EVERYONE in names:
        return (EVERYONE,)
    return tuple(sorted(names))


def check_roles(roles: Iterable[str] | str | None) -> frozenset[str]:
    """Return a key's roles lower-cased and de-duplicated, each named like an audience.

    A role is what a memory's audience names, and audiences are lower-cased and must match
    the audience rule, so a role outside it ("Platform", "Ops Team", "") could never be
    addressed by any memory: the key would read `all` alone.
    """
    if roles is None:
        return frozenset()
    roles = [roles] if isinstance(roles, str) else list(roles)
    # Listed with the key and, as audiences, beside every memory addressed to them; judged
    # as written, before any message repeats one.
    _reject_secrets(" ".join(r for r in roles if isinstance(r, str)), "roles", "roles")
    names: set[str] = set()
    for role in roles:
        if not isinstance(role, str):
            raise InvalidRequestError("roles must be strings", field="roles")
        name = _trimmed(role).lower()
        if not _AUDIENCE.fullmatch(name):
            shown = name if len(name) <= 40 else name[:40] + "..."
            dashed = "-".join(name.split())
            hint = f"; did you mean {dashed!r}?" if _AUDIENCE.fullmatch(dashed) else ""
            raise InvalidRequestError(
                f"role {shown!r} is not a valid name (lowercase letters, digits, '_', '.', '-';"
                f" at most 64 characters; it is what a memory's audiences name){hint}",
                field="roles",
            )
        if name == EVERYONE:
            raise InvalidRequestError(
                f"role {EVERYONE!r} is every key's already: a memory for everyone has the "
                f"audience {EVERYONE!r}; a role names a group, like platform",
                field="roles",
            )
        names.add(name)
    if len(names) > MAX_ROLES:
        raise TooLargeError(
            f"{len(names)} roles; the limit is {MAX_ROLES}", field="roles", limit=MAX_ROLES
        )
    return frozenset(names)


TIME_EXAMPLE = "like 2027-01-31 or 2027-01-31T18:00:00Z"
# The latest time either store keeps. SQLite stores seconds since 1970 as a float, whose
# step there is about 30 microseconds: any later time (9999-12-31T23:59:59.99999Z) rounds
# up to year 10000, which no datetime can hold, and every read of the row would fail.
LATEST_TIME = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


def parse_time(value: object) -> datetime:
    """An ISO 8601 date, or date and time, written as text, in UTC (a time without an offset
    is taken as UTC). Read here, not by pydantic's lax datetime, which takes digits for a
    Unix time in seconds or milliseconds by their size: "20310101" was 1970-08-24. The one
    reading of a time: the API's fields, `valid_until` from the CLI and MCP, restore."""
    if not isinstance(value, str):
        raise ValueError(f"must be an ISO 8601 date or time, {TIME_EXAMPLE}")
    text = value.strip()
    if not text:
        raise ValueError(
            f"is blank: write an ISO 8601 date or time {TIME_EXAMPLE}, or null for none"
        )
    try:
        parsed = datetime.fromisoformat(text)  # 3.11: extended and basic (20310101) forms
    except ValueError as exc:
        if text.isdigit():
            why = " (a number is not read as a Unix time)"
        elif "must be in" in str(exc):
            why = f" ({exc})"  # e.g. month must be in 1..12
        else:
            why = ""
        shown = repr(text if len(text) <= 40 else text[:40] + "...")
        raise ValueError(
            f"{shown} is not an ISO 8601 date or time{why}; write it {TIME_EXAMPLE}"
        ) from None
    late = ValueError("is past 9999-12-31T23:59:59Z, the latest that can be stored")
    try:
        utc = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except OverflowError:  # only 0001-01-01 ahead of UTC, or 9999-12-31 behind it
        if parsed.year == 1:
            raise ValueError(
                "is before 0001-01-01T00:00:00Z, the earliest that can be stored"
            ) from None
        raise late from None
    if utc > LATEST_TIME:
        raise late
    return utc


def check_valid_until(
    ts: datetime | str | None, now: datetime | None = None, past_ok: bool = False
) -> datetime | None:
    """Return `valid_until` as an aware UTC datetime, or None; reject anything not in the future
    (`past_ok`: left to the store, which keeps a memory's own: `rules.settle_expiry`).

    Strings are ISO 8601 (`2026-12-31`, `2026-12-31T18:00:00+02:00`, `...Z`). A time without
    an offset is taken as UTC; a bare date means midnight UTC at the start of that day.
    """
    if ts is None or (isinstance(ts, str) and not ts.strip()):
        return None
    try:
        ts = parse_time(ts.isoformat() if isinstance(ts, datetime) else ts)
    except ValueError as exc:
        raise InvalidRequestError(f"valid_until {exc}", field="valid_until") from None
    if now is None:
        now = datetime.now(UTC)
    elif now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    if ts <= now and not past_ok:
        raise InvalidRequestError(
            f"valid_until {ts.isoformat().replace('+00:00', 'Z')} is not in the future; "
            "an expired memory would never be returned",
            field="valid_until",
        )
    return ts


# --- secrets ----------------------------------------------------------------------------


def _reject_secrets(text: str, what: str, field: str) -> None:
    kinds = find_secrets(text)
    if kinds:
        raise SecretDetectedError(
            f"{what} looks like it contains a secret ({', '.join(kinds)}); "
            "remove it or reference where it is stored instead",
            field=field,
            kinds=kinds,
        )
