"""Write `relay import`'s drafts through the API, and retire the sections a file lost.

A file named in an import owns the live memories that carry its source and an id the
importer made (`imp_...`); hand-written memories and other files' are never touched.
After the new drafts are written, the owned memories no draft kept are forgotten (the
normal delete, with a tombstone), so a section removed from the file stops reaching
agents' prompts.

An id is never reused, so a section whose id is taken is written under the next free
generation of its id (`imp_....2`), and later imports find it there among the file's live
memories. The id is taken by its tombstone once the section was retired, or by a memory
this key may not read: the file imported before for an audience the key lacks, live or
retired there (the server does not say which, nor does this).
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from relay.client import memory_path
from relay.errors import ConflictError, InvalidRequestError
from relay.importer import draft_label

if TYPE_CHECKING:
    from relay.client import RelayClient
    from relay.importer import ImportDraft

_IMPORTED_ID = re.compile(r"(imp_[0-9a-f]{16})(?:\.[0-9]+)?")


@dataclass
class ImportTally:
    written: int = 0
    unchanged: int = 0
    retired: int = 0


def import_files(
    client: RelayClient,
    drafts_by_source: Mapping[str, Sequence[ImportDraft]],
    audiences: Sequence[str] = (),
    keep_removed: bool = False,
    on_batch: Callable[[int], None] = lambda _: None,
    gone: Mapping[str, set[str]] | None = None,
) -> ImportTally:
    """Upsert every file's drafts, then retire what each file no longer holds, and the
    memories of files `gone` from a named folder (`vanished`)."""
    owned = {source: owned_ids(client, source) for source in drafts_by_source}
    drafts = [
        draft
        for source, file_drafts in drafts_by_source.items()
        for draft in with_live_ids(file_drafts, owned[source])
    ]
    from relay.client import batches

    tally = ImportTally()
    for batch in batches(drafts, lambda d: _item(d, audiences)):
        result = _upsert(client, batch, audiences)
        tally.written += result["written"]
        tally.unchanged += result["unchanged"]
        on_batch(len(batch))
    if not keep_removed:
        kept = {d.id for d in drafts}
        for memory_id in sorted(set().union(*owned.values(), *(gone or {}).values()) - kept):
            client.request("DELETE", memory_path(memory_id))
            tally.retired += 1
    return tally


def owned_ids(client: RelayClient, source: str) -> set[str]:
    """The live memories an earlier import of `source` made."""
    return {m["id"] for m in _list(client, {"source": source}) if _IMPORTED_ID.fullmatch(m["id"])}


def vanished(
    client: RelayClient, folders: Mapping[str, Path], parsed: Collection[str]
) -> dict[str, set[str]]:
    """The import-made memories of files once imported from under `folders` (source
    prefix -> the folder on disk) that are no longer there: deleted or renamed since. A
    file that is there but was not read this time (a folder the walk skips) keeps its."""
    out: dict[str, set[str]] = {}
    for prefix, folder in folders.items():
        for memory in _list(client, {"source_prefix": prefix}):
            source = memory["source"]
            if source in parsed or not _IMPORTED_ID.fullmatch(memory["id"]):
                continue
            if not (folder / source[len(prefix) :]).exists():
                out.setdefault(source, set()).add(memory["id"])
    return out


def with_live_ids(drafts: Sequence[ImportDraft], owned: set[str]) -> list[ImportDraft]:
    """Each draft under the id its section lives at now: a revived section's generation.

    A section lives at two generations when keys for different audiences imported the
    file (the second took the next id past the first's, which it could not read); a key
    that reads both writes the oldest and, unless told to keep them, retires the other."""
    live: dict[str, str] = {}
    for memory_id in sorted(owned, key=_generation, reverse=True):
        live[_base_id(memory_id)] = memory_id
    return [dataclasses.replace(d, id=live.get(d.id, d.id)) for d in drafts]


def _generation(memory_id: str) -> int:
    """`imp_x` -> 1, `imp_x.2` -> 2 (any other id: 1)."""
    base = _base_id(memory_id)
    return int(memory_id[len(base) + 1 :]) if memory_id != base else 1


def _base_id(memory_id: str) -> str:
    match = _IMPORTED_ID.fullmatch(memory_id)
    return match.group(1) if match else memory_id


def _list(client: RelayClient, filters: dict[str, str]) -> Iterator[dict]:
    query: dict[str, str | int] = {**filters, "limit": 500}
    while True:
        page = client.get(f"/v1/memories?{urllib.parse.urlencode(query)}")
        yield from page["items"]
        if not page["next_cursor"]:
            return
        query["cursor"] = page["next_cursor"]


def _upsert(client: RelayClient, batch: list[ImportDraft], audiences: Sequence[str]) -> dict:
    while True:
        try:
            return client.post("/v1/memories/batch", {"items": _items(batch, audiences)})
        except ConflictError as exc:
            # A new section's id is taken: retired before (its tombstone keeps the id), or
            # held by a memory this key may not read. Rare, so only now is that section
            # moved to the id's next generation, and the batch sent again.
            taken = exc.details.get("memory_id")
            if not any(d.id == taken for d in batch):
                raise
            batch = [
                dataclasses.replace(d, id=_next_generation(d.id)) if d.id == taken else d
                for d in batch
            ]


def _next_generation(memory_id: str) -> str:
    """`imp_x` -> `imp_x.2`, `imp_x.2` -> `imp_x.3`: where a section whose id is taken goes."""
    return f"{_base_id(memory_id)}.{_generation(memory_id) + 1}"


def check_drafts(drafts: Iterable[ImportDraft], audiences: Sequence[str] = ()) -> None:
    """Judge every draft as the server will (`relay.writes.draft_from_fields`, on the item
    the batch will carry), before anything is written. The server names a rejected item
    only by its place in a batch; here the error names the file and section, and one bad
    section stops the whole import, not only the batch it would have travelled in."""
    from relay.writes import draft_from_fields

    seen: dict[str, int] = {}
    for draft in drafts:
        seen[draft.source] = seen.get(draft.source, 0) + 1
        try:
            draft_from_fields(_item(draft, audiences))  # the org's audiences: the server's
        except InvalidRequestError as exc:
            message = f"{draft_label(draft, seen[draft.source])}: {exc.message}"
            raise type(exc)(message, **exc.details) from None


def _items(batch: list[ImportDraft], audiences: Sequence[str]) -> list[dict]:
    return [_item(d, audiences) for d in batch]


def _item(d: ImportDraft, audiences: Sequence[str]) -> dict:
    return {
        "id": d.id,
        "body": d.body,
        "title": d.title,
        "source": d.source,
        "tags": list(d.tags),
        **({"audiences": list(audiences)} if audiences else {}),
    }
