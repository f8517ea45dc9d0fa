"""Restore a `relay export` file: `relay restore`, export's way back.

An export is JSON lines, one memory a line as `GET /v1/memories` shows it
(`Memory.to_dict`), between a first line `{"relay_export": "begin", "format": 2}` and a
last line `{"relay_export": "end", "memories": N}`, N the memory lines written: a file
cut short (a partial copy, a disk full while exporting) ends without it, and one whose
lines were removed or added since holds another count (`read_export` refuses both unless
asked). An export by an older release has neither line, and is read with a word that its
completeness cannot be checked. Each memory is written back under its id with what a write can
carry (`RESTORED_FIELDS`) through the batch endpoint, so the restoring key may write
only what it may, every field is checked as on every write, and an unchanged memory
makes no new revision: restoring twice changes nothing. History and authorship cannot
be carried: a memory new to the organisation starts at revision 1, by the restoring key.

What a write would refuse, and what a restore must still get right:

- A memory already expired (or about to, before its batch lands) cannot be written:
  it is skipped and counted, never fatal.
- `supersedes` may name only memories that exist, so a memory is written after those
  it supersedes (`write_order`). A link to a memory neither in the file nor readable by
  the key on the server (deleted since, or outside the exporting key's audiences) is
  dropped and counted, unless the server shows it on that memory: then it is kept, so
  restoring into the server the file came from changes nothing. The server shows a key
  only the links it may follow, and keeps the others whatever a write sends, so a
  superseded memory never comes back into its readers' recall: where the server says it
  withholds links on that memory, such a link is counted apart, as left to the server,
  not as dropped.
- A cycle of `supersedes` links is refused (older servers took them, and recall showed
  none of the memories in one): a link that would close one is dropped and counted,
  never fatal. In the file, that is the link of the cycle's earliest line to a memory
  written after it and not yet on the server; any other the server names when it
  refuses the batch (`closes_cycle`), and the batch is sent again without it, so where
  the server already holds one of a cycle's links, that one is kept.
- Every line is read and checked before anything is written: a malformed line stops the
  restore with its file and line, as does one without a field of `RESTORED_FIELDS` (a
  hand edit), which a write would otherwise set to its default. The server may still
  refuse a batch (an audience the organisation has no key for); the batches before it
  stay written.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from relay.client import memory_path
from relay.errors import InvalidRequestError, NotFoundError, RelayError
from relay.models import CONTENT_FIELDS

if TYPE_CHECKING:
    from relay.client import RelayClient

RESTORED_FIELDS = ("id", *CONTENT_FIELDS)
# Line breaks to other readers (str.splitlines, JavaScript before ES2019, many editors) that
# an export written with ensure_ascii=False would hold raw: escaped, the line stays one line.
_BREAKS_IN_STRINGS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


# The export format with begin and end lines; an older release's export (no such lines) is 1.
EXPORT_FORMAT = 2
_MARK = "relay_export"


def export_begin() -> str:
    """An export's first line."""
    return json.dumps({_MARK: "begin", "format": EXPORT_FORMAT}) + "\n"


def export_end(memories: int) -> str:
    """An export's last line, counting the memory lines before it: without it, or with
    another count, the file is not what the export wrote."""
    return json.dumps({_MARK: "end", "memories": memories}) + "\n"


def export_line(memory: dict[str, Any]) -> str:
    """One memory as a line of an export, readable by any line reader: the text stays
    UTF-8 as written, but for the few characters some readers take as a line break
    (outside strings JSON holds none of them, so the escapes land in strings only)."""
    return json.dumps(memory, ensure_ascii=False).translate(_BREAKS_IN_STRINGS) + "\n"


def json_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) for every line of JSON lines `text` that holds anything. Lines
    end at "\n" alone (a "\r" before it is JSON whitespace): str.splitlines also breaks at
    U+2028, U+2029, \\x85 and \\x0b-\\x1e, which a JSON string may hold raw."""
    return [(n, line) for n, line in enumerate(text.split("\n"), 1) if line.strip(" \t\r")]


# A memory expiring this soon could expire before its batch is written, and the server
# would then refuse the whole batch; it is skipped with the expired ones.
EXPIRY_MARGIN = timedelta(minutes=5)

_TYPES: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "body": (str,),
    "title": (str, type(None)),
    "source": (str, type(None)),
    "valid_until": (str, type(None)),
    "pinned": (bool,),
}
_LISTS = ("audiences", "tags", "supersedes")


@dataclass(frozen=True)
class ExportedMemory:
    """One line of an export, reduced to what a restore writes."""

    line: int
    fields: dict[str, Any]

    @property
    def id(self) -> str:
        return self.fields["id"]

    @property
    def supersedes(self) -> list[str]:
        return self.fields.get("supersedes") or []


@dataclass(frozen=True)
class ExportFile:
    """An export as read: its memories, and why its completeness is not vouched for (an
    older release's file, or one found incomplete and read as asked), or None."""

    memories: list[ExportedMemory]
    unchecked: str | None = None


@dataclass
class RestoreTally:
    restored: int = 0
    written: int = 0
    unchanged: int = 0
    expired: int = 0
    dropped_links: int = 0
    cycle_links: int = 0  # dropped: each would close a cycle of supersedes links
    unseen_links: int = 0  # to memories the key cannot read, on a memory hiding links from it
    in_flight: int = 0  # memories of the batch sent and not yet answered: maybe written


def is_export_line(value: object) -> bool:
    """Whether a parsed JSON value has the shape of one `relay export` line: a memory, or
    the export's begin or end line."""
    return _problem(value) is None or is_export_mark(value)


def is_export_mark(value: object) -> bool:
    """Whether a parsed JSON value is an export's begin or end line, by its shape."""
    return isinstance(value, dict) and _MARK in value and "id" not in value


def _mark_problem(value: dict) -> str | None:
    kind = value[_MARK]
    if kind == "begin":
        version = value.get("format")
        if not isinstance(version, int) or isinstance(version, bool):
            return "its begin line has no format number"
        if version > EXPORT_FORMAT:
            return (
                f"it is in export format {version}, newer than this relay reads"
                f" ({EXPORT_FORMAT}): restore it with the release that exported it, or newer"
            )
        return None
    if kind == "end":
        count = value.get("memories")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            return "its end line has no count of memories"
        return None
    return f"{_MARK} is {kind!r}, not 'begin' or 'end'"


def _problem(value: object) -> str | None:
    if not isinstance(value, dict):
        return "a JSON object is expected"
    for name in ("id", "body", "audiences"):
        if name not in value:
            return f"it has no {name!r}"
    for name, types in _TYPES.items():
        if name in value and not isinstance(value[name], types):
            return f"{name!r} is not {'true or false' if types == (bool,) else 'a string'}"
    for name in _LISTS:
        items = value.get(name)
        if items is not None and (
            not isinstance(items, list) or not all(isinstance(i, str) for i in items)
        ):
            return f"{name!r} is not a list of strings"
    if not value["audiences"]:
        return "'audiences' is empty (an export names at least 'all')"
    return None


def _missing(value: dict) -> str | None:
    """What a memory line lacks of the fields a write carries: every export has held them
    all, and one left out (a hand edit) would be written as the write's default, over what
    the server holds (a pin, an expiry)."""
    if not (missing := [name for name in RESTORED_FIELDS if name not in value]):
        return None
    one = len(missing) == 1
    return (
        f"it lacks {', '.join(map(repr, missing))}, which every line of an export has (null,"
        f" [] or false for none): a restore would write"
        f" {'a default in its' if one else 'defaults in their'} place"
    )


def read_export(text: str, name: str, allow_incomplete: bool = False) -> ExportFile:
    """Parse an export, every line or none: raises naming the file and line of the first
    one that is not an exported memory (or its begin or end line), or repeats an id; and,
    unless `allow_incomplete`, when the file is not whole (`_Completeness`)."""
    memories: list[ExportedMemory] = []
    lines: dict[str, int] = {}
    whole = _Completeness(name)
    for number, raw in json_lines(text):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InvalidRequestError(
                f"{name}:{number}: not JSON ({exc.msg}); a relay export file has one memory a line",
                line=number,
            ) from None
        if is_export_mark(value):
            if problem := _mark_problem(value):
                raise InvalidRequestError(f"{name}:{number}: {problem}", line=number)
            whole.mark(number, value)
            continue
        whole.memory()
        problem = _problem(value) or _missing(value)
        if problem:
            raise InvalidRequestError(
                f"{name}:{number}: not a memory from relay export: {problem}", line=number
            )
        if value["id"] in lines:
            raise InvalidRequestError(
                f"{name}:{number}: memory {value['id']!r} is already on line {lines[value['id']]}",
                line=number,
            )
        lines[value["id"]] = number
        fields = {k: value[k] for k in RESTORED_FIELDS if k in value}
        memories.append(ExportedMemory(number, fields))
    incomplete, unchecked = whole.verdict()
    if incomplete and not allow_incomplete:
        raise InvalidRequestError(
            f"{incomplete}; nothing was restored (--allow-incomplete restores the"
            f" {_memories(len(memories))} it holds)"
        )
    if incomplete:
        unchecked = f"{incomplete}; restoring the {_memories(len(memories))} it holds, as asked"
    return ExportFile(memories, unchecked)


class _Completeness:
    """Whether the memory lines of an export are all that `relay export` wrote: each begin
    line is followed by an end line counting the memory lines between them. A begin line
    never ended is a file cut short; another count, lines removed or added since. Memory
    lines outside any begin and end (all of them, in an older release's export) cannot be
    checked."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.begun: int | None = None  # the line of the begin line not yet ended
        self.count = 0  # memory lines since the last begin or end line (or the start)
        self.lines = 0  # lines read, of any kind
        self.problem: str | None = None  # the first reason the file is not whole
        self.unmarked = 0  # memory lines outside any begin and end
        self.marked = False  # any begin or end line read

    def memory(self) -> None:
        self.count += 1
        self.lines += 1

    def mark(self, number: int, value: dict) -> None:
        self.lines += 1
        self.marked = True
        if value[_MARK] == "begin":
            if self.begun is not None and self.problem is None:
                self.problem = (
                    f"{self.name}:{number}: a new export begins before the one begun on line"
                    f" {self.begun} ended: that one was cut short after {_memories(self.count)}"
                )
            elif self.begun is None:
                self.unmarked += self.count
            self.begun, self.count = number, 0
            return
        if value["memories"] != self.count and self.problem is None:
            self.problem = (
                f"{self.name}:{number}: relay export wrote {_memories(value['memories'])}"
                f" before this end line, and the file holds {self.count}: lines were removed"
                " or added since"
            )
        self.begun, self.count = None, 0

    def verdict(self) -> tuple[str | None, str | None]:
        """(why the file is not whole, or None; why its completeness cannot be checked,
        or None)."""
        if self.begun is not None:
            self.problem = self.problem or (
                f"{self.name} was cut short: it ends after {_memories(self.count)} without the"
                " end line relay export writes last (a partial copy, or a disk full while"
                " exporting)"
            )
        else:
            self.unmarked += self.count
        if not self.lines:
            return None, (
                f"{self.name} is empty: an older release's export of no memory, or a file cut"
                " short before its first line"
            )
        if not self.marked:
            return None, (
                f"{self.name} has no begin and end lines (an export by an older release):"
                " whether it is whole, not cut short, cannot be checked"
            )
        if n := self.unmarked:
            return self.problem, (
                f"{_memories(n)} of {self.name} {'lies' if n == 1 else 'lie'} outside its"
                " export's begin and end lines: whether they are all there cannot be checked"
            )
        return self.problem, None


def _memories(n: int) -> str:
    return f"{n} {'memory' if n == 1 else 'memories'}"


def split_expired(
    memories: Sequence[ExportedMemory], name: str, now: datetime
) -> tuple[list[ExportedMemory], int]:
    """The memories still valid a few minutes from `now`, and how many are not."""
    from relay.hygiene import parse_time

    live = []
    for memory in memories:
        raw = memory.fields.get("valid_until")
        try:
            until = None if raw is None else parse_time(raw)
        except ValueError as exc:
            raise InvalidRequestError(f"{name}:{memory.line}: valid_until {exc}") from None
        if until is None or until > now + EXPIRY_MARGIN:
            live.append(memory)
    return live, len(memories) - len(live)


def check_memories(
    memories: Sequence[ExportedMemory],
    name: str,
    now: datetime,
    stored: Callable[[str], dict | None] = lambda _: None,
) -> None:
    """Judge every memory as the server will before anything is written, naming the line of
    the first one it would refuse (a secret, an oversized body): `draft_from_fields`, and
    the store's rule for an invisible format character in a source or a tag, which a memory
    stored with it by an older release keeps (`rules.judge_format_characters`). Only for a
    memory that holds one is `stored` asked for it as the server has it (None: it has none)."""
    from relay.hygiene import check_format_characters
    from relay.writes import draft_from_fields

    for memory in memories:
        try:
            draft = draft_from_fields(memory.fields, None, now)
            try:
                check_format_characters(draft.source, draft.tags)
            except InvalidRequestError:
                held = stored(memory.id) or {}
                check_format_characters(
                    draft.source, draft.tags, held.get("source"), held.get("tags", ())
                )
        except InvalidRequestError as exc:
            raise type(exc)(f"{name}:{memory.line}: {exc.message}", **exc.details) from None


def write_order(
    memories: Sequence[ExportedMemory],
) -> tuple[list[ExportedMemory], set[tuple[str, str]]]:
    """The memories in file order, except that each comes after those among them it
    supersedes; and the links that had to wait: those closing a cycle, each broken at its
    earliest line (the links of that line to memories that lead back to it)."""
    index = {m.id: i for i, m in enumerate(memories)}
    waiting = {m.id: {t for t in m.supersedes if t in index and t != m.id} for m in memories}
    dependents: dict[str, list[str]] = {}
    for memory_id, targets in waiting.items():
        for target in targets:
            dependents.setdefault(target, []).append(memory_id)
    ready = [index[mid] for mid, targets in waiting.items() if not targets]
    heapq.heapify(ready)
    placed: set[str] = set()
    order: list[ExportedMemory] = []
    deferred: set[tuple[str, str]] = set()
    while len(order) < len(memories):
        if not ready:  # all that is left waits on a cycle: its earliest line goes first
            mid = _earliest_in_cycle(waiting, placed, index)
            back = {t for t in waiting[mid] if _leads_to(t, mid, waiting)}
            deferred |= {(mid, target) for target in back}
            waiting[mid] -= back
            if not waiting[mid]:
                heapq.heappush(ready, index[mid])
            continue
        memory = memories[heapq.heappop(ready)]
        if memory.id in placed:
            continue
        order.append(memory)
        placed.add(memory.id)
        for dependent in dependents.get(memory.id, ()):
            if dependent not in placed and memory.id in waiting[dependent]:
                waiting[dependent].discard(memory.id)
                if not waiting[dependent]:
                    heapq.heappush(ready, index[dependent])
    return order, deferred


def _leads_to(start: str, goal: str, waiting: dict[str, set[str]]) -> bool:
    """Whether `start` waits on `goal`, directly or through others."""
    seen, queue = {start}, [start]
    for node in queue:
        if node == goal:
            return True
        for target in waiting[node] - seen:
            seen.add(target)
            queue.append(target)
    return False


def _earliest_in_cycle(
    waiting: dict[str, set[str]], placed: set[str], index: dict[str, int]
) -> str:
    """Follow what the earliest unplaced memory waits on until a memory repeats: those
    from its first visit on form a cycle; the one of them earliest in the file."""
    node = min((mid for mid in waiting if mid not in placed), key=index.__getitem__)
    path: list[str] = []
    visited: dict[str, int] = {}
    while node not in visited:
        visited[node] = len(path)
        path.append(node)
        node = min(waiting[node], key=index.__getitem__)
    return min(path[visited[node] :], key=index.__getitem__)


def restore_memories(
    client: RelayClient,
    memories: Sequence[ExportedMemory],
    name: str,
    on_batch: Callable[[int], None] = lambda _: None,
    now: datetime | None = None,
    tally: RestoreTally | None = None,
) -> RestoreTally:
    """Write the export's memories back; see the module's docstring for the rules.
    `tally` counts as it goes, so a caller stopped midway can say what was done."""
    from relay.client import batches

    now = now or datetime.now(UTC)
    live, expired = split_expired(memories, name, now)
    links = _Links(client)
    check_memories(live, name, now, links.memory)
    order, deferred = write_order(live)
    in_file = {m.id for m in live}
    tally = tally or RestoreTally()
    tally.restored, tally.expired = len(live), expired
    on_batch(expired)
    writes: list[ExportedMemory] = []
    for memory in order:
        kept = []
        for target in memory.supersedes:
            if target in in_file and (memory.id, target) not in deferred:
                kept.append(target)
            elif links.readable(target):
                kept.append(target)  # the server says whether it closes a cycle (`_send`)
            elif target in in_file:
                tally.cycle_links += 1  # written after it, and leading back to it
            elif links.held_by(memory.id, target):
                kept.append(target)  # the server keeps a link it holds, readable or not
            elif links.withholds_links(memory.id):
                tally.unseen_links += 1  # maybe one of those: it stays if the server has it
            else:
                tally.dropped_links += 1
        writes.append(ExportedMemory(memory.line, {**memory.fields, "supersedes": kept}))
    for batch in batches(writes, lambda m: m.fields):
        tally.in_flight = len(batch)
        result = _send(client, batch, name, tally)
        tally.in_flight = 0
        tally.written += result["written"]
        tally.unchanged += result["unchanged"]
        on_batch(len(batch))
    return tally


class _Links:
    """What the server says about `supersedes` targets outside the file, asked once each."""

    def __init__(self, client: RelayClient) -> None:
        self.client = client
        self.memories: dict[str, dict | None] = {}

    def _get(self, path: str) -> dict | None:
        try:
            return self.client.get(path)
        except NotFoundError:
            return None

    def memory(self, memory_id: str) -> dict | None:
        if memory_id not in self.memories:
            self.memories[memory_id] = self._get(memory_path(memory_id))
        return self.memories[memory_id]

    def readable(self, memory_id: str) -> bool:
        return self.memory(memory_id) is not None

    def held_by(self, memory_id: str, target: str) -> bool:
        """Whether the server's `memory_id` already supersedes `target`: a write carries
        such a link over whether its target is deleted since or unreadable to this key, so
        keeping it changes nothing (and dropping it would change the memory)."""
        stored = self.memory(memory_id)
        return stored is not None and target in stored.get("supersedes", ())

    def withholds_links(self, memory_id: str) -> bool:
        """Whether the server's `memory_id` supersedes memories this key cannot read: the
        server keeps those links whatever a write sends, and does not say which they are."""
        stored = self.memory(memory_id)
        return stored is not None and stored.get("supersedes_withheld", 0) > 0


def _send(client: RelayClient, batch: list[ExportedMemory], name: str, tally: RestoreTally) -> dict:
    """Write `batch`; a link the server refuses as closing a cycle is dropped, counted,
    and the batch (all or nothing, so none of it was written) sent again without it."""
    while True:
        try:
            return client.post("/v1/memories/batch", {"items": [m.fields for m in batch]})
        except RelayError as exc:
            item, target = exc.details.get("item"), exc.details.get("closes_cycle")
            if not (
                isinstance(exc, InvalidRequestError)
                and isinstance(item, int)
                and 0 <= item < len(batch)
                and target in batch[item].supersedes
            ):
                raise _located(exc, batch, name) from None
        memory = batch[item]
        links = [t for t in memory.supersedes if t != target]
        batch[item] = ExportedMemory(memory.line, {**memory.fields, "supersedes": links})
        tally.cycle_links += 1


def _located(exc: RelayError, batch: list[ExportedMemory], name: str) -> RelayError:
    """The server's refusal of a batch, naming the file and line instead of `items.N`."""
    memory, message = None, exc.message
    item = exc.details.get("item")
    if isinstance(item, int) and 0 <= item < len(batch):
        memory, message = batch[item], exc.message.removeprefix(f"items.{item}: ")
    else:
        memory = next((m for m in batch if m.id == exc.details.get("memory_id")), None)
    if memory is None:
        return exc
    return type(exc)(f"{name}:{memory.line}: {message}", **exc.details)
