"""Write `relay import`'s drafts through the API, and retire the sections a file lost.

A file named in an import owns the live memories that carry its source and an id the
importer made (`imp_...`); hand-written memories and other files' are never touched.
Each draft is written over the owned memory it continues (`continued_ids`: the same text
wherever it moved, else the same section edited). After the new drafts are written, the
owned memories no draft kept are forgotten (the normal delete, with a tombstone), so a
section removed from the file stops reaching agents' prompts; each only at the revision the
import read it at, so one a teammate edited meanwhile is left, and named.

An id is never reused, so a section whose id is taken is written under the next free
generation of its id (`imp_....2`), and later imports find it there among the file's live
memories. The id is taken by its tombstone once the section was retired, or by a memory
this key may not read: the file imported before for an audience the key lacks, live or
retired there (the server does not say which, nor does this).

An import for audiences the key does not read is refused before anything is read or
written (`check_readable`): the key could not list what it wrote, so the next import could
neither continue nor retire it, and would add a copy of every section each time.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import os
import re
import urllib.parse
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from relay.client import memory_path
from relay.errors import (
    ConflictError,
    ForbiddenError,
    InvalidRequestError,
    NotFoundError,
    RelayError,
)
from relay.importer import draft_label

if TYPE_CHECKING:
    from relay.client import RelayClient
    from relay.import_files import FormerName, GitIgnored
    from relay.importer import ImportDraft

_IMPORTED_ID = re.compile(r"(imp_[0-9a-f]{16})(?:\.[0-9]+)?")


@dataclass
class ImportTally:
    written: int = 0
    unchanged: int = 0
    retired: int = 0
    # Written over a change made since the file's text was imported (`relay edit`).
    overwritten: list[ImportDraft] = field(default_factory=list)
    # Written again after their memory was deleted (`relay forget`, or retired): (draft, old id).
    revived: list[tuple[ImportDraft, str]] = field(default_factory=list)
    # Not written: their memory changed (`relay edit`, another import) after this import read
    # it, so what it judged by (the text, to count an overwritten edit; the audiences, to
    # keep them) was out of date. Importing again writes the file over the change, counted.
    changed: list[ImportDraft] = field(default_factory=list)
    # Not retired though their section left the file (or their file was deleted): changed
    # (`relay edit`, another import) or deleted after this import read them, as listed.
    # Importing again retires one still there, as it is then.
    unretired: list[dict] = field(default_factory=list)
    # Drafts of the batch sent and not yet answered: stopped now, the server may still
    # write them (it commits a batch it has read whatever became of the client).
    in_flight: int = 0


def check_readable(client: RelayClient, audiences: Sequence[str]) -> None:
    """Refuse an import for `audiences` (--audience) none of which this key reads. The key
    could write its memories, but not read them back: every later import would find the
    file's sections gone, and write each again under its id's next generation (`imp_x.2`,
    `imp_x.3`, ...), a copy of the runbook per run that it could neither update nor retire.
    The server answers a memory the key may not read as it does a missing one (it must not
    tell the key more), so the import is refused up front, on the key's own roles."""
    from relay.client import whoami
    from relay.hygiene import check_audiences
    from relay.models import EVERYONE

    if not audiences:
        return
    wanted = check_audiences(audiences)
    key = whoami(client)["key"]
    reads = {EVERYONE, *key.get("roles", ())}
    if "admin" in key.get("scopes", ()) or reads & set(wanted):
        return
    raise ForbiddenError(
        f"this key cannot import for {', '.join(wanted)}: it reads {', '.join(sorted(reads))},"
        " so it could not read these memories back, and every later import of the file would"
        " write another copy of each section instead of updating or retiring it; nothing was"
        f" imported. Import it with a key that reads {' or '.join(wanted)}, or with an admin key"
    )


def import_files(
    client: RelayClient,
    drafts_by_source: Mapping[str, Sequence[ImportDraft]],
    audiences: Sequence[str] = (),
    keep_removed: bool = False,
    on_batch: Callable[[int], None] = lambda _: None,
    gone: Mapping[str, Mapping[str, dict]] | None = None,
    tally: ImportTally | None = None,
) -> ImportTally:
    """Upsert every file's drafts, then retire what each file no longer holds, and the
    memories of files `gone` from a named folder (`vanished`: source -> id -> the memory as
    listed). `tally` counts as it goes, so a caller interrupted midway can say what was
    done."""
    owned = {source: owned_memories(client, source) for source in drafts_by_source}
    drafts = [
        draft
        for source, file_drafts in drafts_by_source.items()
        for draft in continued_ids(file_drafts, owned[source])
    ]
    from relay.client import batches

    live = {m["id"]: m for memories in owned.values() for m in memories}
    # Without --audience a memory keeps its audiences: an import must not open to everyone
    # what was imported for a role, or narrowed by hand, before.
    drafts = [
        dataclasses.replace(d, audiences=tuple(live[d.id]["audiences"])) if d.id in live else d
        for d in drafts
    ]
    edited = {d.id for d in drafts if d.id in live and edited_since_import(client, live[d.id], d)}
    # Each memory is written only at the revision read above, which all of that was judged on.
    read = {memory_id: m["revision"] for memory_id, m in live.items()}
    tally = tally or ImportTally()
    for batch in batches(drafts, lambda d: _item(d, audiences, read.get(d.id))):
        tally.in_flight = len(batch)
        result, sent, changed = _upsert(client, batch, audiences, read)
        tally.in_flight = 0
        tally.written += result["written"]
        tally.unchanged += result["unchanged"]
        tally.overwritten += [was for was, _ in sent if was.id in edited]
        tally.revived += [(d, was.id) for was, d in sent if was != d]
        tally.changed += changed
        on_batch(len(batch))
    if not keep_removed:
        kept = {d.id for d in drafts}
        owned_now = {**live, **{i: m for ms in (gone or {}).values() for i, m in ms.items()}}
        for memory_id in sorted(set(owned_now) - kept):
            if retire(client, owned_now[memory_id]):
                tally.retired += 1
            else:
                tally.unretired.append(owned_now[memory_id])
    return tally


def retire(client: RelayClient, memory: dict) -> bool:
    """Delete `memory` (as listed) at the revision listed; False when it moved on since (an
    edit, narrowed out of this key's sight, deleted): it is left as it is then, as the
    import judged what it read, not what a teammate wrote after."""
    rest = f"?expected_revision={memory['revision']}"
    try:
        client.request("DELETE", memory_path(memory["id"], rest))
    except (ConflictError, NotFoundError):
        return False
    return True


def edited_since_import(client: RelayClient, memory: dict, draft: ImportDraft) -> bool:
    """Whether writing `draft` over `memory` undoes a change made to it since the file's
    text was imported (`relay edit`, or an import of another version of the file): the
    draft's text is what the memory held before, or only fields an import never sets (a
    pin, an expiry, supersedes links) differ. An edit to a section that also changed in
    the file cannot be told from the file's change."""
    text = (draft.title, draft.body, list(draft.tags))
    if (memory["title"], memory["body"], memory["tags"]) == text:
        return bool(memory["pinned"] or memory["valid_until"] or memory["supersedes"])
    if memory["revision"] == 1:
        return False
    history = client.get(memory_path(memory["id"], "/revisions"))["items"]
    return any(
        (r["title"], r["body"], r["tags"]) == text
        for r in history
        if r["revision"] < memory["revision"] and r["action"] != "delete" and not r["withheld"]
    )


def owned_memories(client: RelayClient, source: str) -> list[dict]:
    """The live memories an earlier import of `source` made."""
    return [m for m in _list(client, {"source": source}) if _IMPORTED_ID.fullmatch(m["id"])]


def deleted_count(client: RelayClient, sources: Iterable[str]) -> int:
    """How many deleted memories (retired by an import, or forgotten) were recorded under
    `sources` (a folder's prefix, with its closing `/`, or a file's own source), counted by
    the server. A server from before it counted them answers 404: none known."""
    total = 0
    for source in sources:
        which = "source_prefix" if source.endswith("/") else "source"
        try:
            answer = client.get(f"/v1/tombstones/count?{urllib.parse.urlencode({which: source})}")
        except NotFoundError:
            return 0
        total += answer["count"]
    return total


@dataclass
class Vanished:
    """What `vanished` found: the memories to retire, by source, and those it leaves."""

    # source -> id -> the memory as listed: retired at the revision listed (`retire`).
    gone: dict[str, dict[str, dict]] = field(default_factory=dict)
    # Memories of files not on disk that this checkout did not delete (another branch's, a
    # newer clone's, left out of a sparse checkout): left as they are, by source.
    absent: dict[str, dict[str, dict]] = field(default_factory=dict)
    # Why git could not say which files were deleted (all of `absent`'s, then), or None.
    unsure: str | None = None
    # Memories of files missing from a folder outside any git work tree: with no history to
    # tell a deleted file from one moved (or a teammate's, not here yet), left, by source.
    outside_git: dict[str, set[str]] = field(default_factory=dict)
    # Memories of files on disk that git ignores (imported before imports followed git's
    # ignore rules, named since, or ignored since): a walk no longer reads them, but the
    # file is there, so they are left as they are unless the user asks (--retire-ignored).
    ignored: dict[str, dict[str, dict]] = field(default_factory=dict)

    def empty(self) -> bool:
        """Whether no memory of a file not read was found, to retire or to leave."""
        return not (self.gone or self.absent or self.outside_git or self.ignored)

    def under(self, prefix: str) -> bool:
        """Whether a memory was found of a file under `prefix` (a folder's sources), or of
        the file whose source is `prefix` (one without a closing `/`)."""
        found = (self.gone, self.absent, self.outside_git, self.ignored)
        return any(
            source.startswith(prefix) if prefix.endswith("/") else source == prefix
            for sources in found
            for source in sources
        )


def vanished(
    client: RelayClient,
    folders: Mapping[str, Path],
    parsed: Collection[str],
    ignored: GitIgnored | None = None,
) -> Vanished:
    """The import-made memories of files once imported from under `folders` (source prefix
    -> the folder on disk; a source with no closing `/` -> that file, named though gone)
    that the checkout deleted or renamed since,
    as git says (`git_deleted`). Not on disk is not enough: a teammate's file on another
    branch, or newer than this clone, is not there either, and retiring it would delete
    their memories (text and all, a tombstone is all a delete keeps). Without git's answer
    nothing is retired, nor outside a git work tree (`outside_git`). A file that is there
    but was not read this time (a folder the walk skips) keeps its memories; those of a
    file git ignores (as the walk learnt, `ignored`) are set apart in `ignored`."""
    from relay.import_files import NoGitAnswer, git_deleted, git_work_tree

    found = Vanished()
    missing: dict[Path, dict[str, str]] = {}  # work tree -> path in it -> source
    for prefix, folder in folders.items():
        work_tree = git_work_tree(folder / "_")
        for memory in _list(client, {"source_prefix": prefix}):
            source = memory["source"]
            if source in parsed or not _IMPORTED_ID.fullmatch(memory["id"]):
                continue
            if not (prefix.endswith("/") or source == prefix):  # a file named: itself alone
                continue
            path = folder / source[len(prefix) :]
            if path.exists():
                if ignored is not None and ignored.covers(path):
                    found.ignored.setdefault(source, {})[memory["id"]] = memory
                continue
            if work_tree is None:
                found.outside_git.setdefault(source, set()).add(memory["id"])
                continue
            found.absent.setdefault(source, {})[memory["id"]] = memory
            # As git names it: from the real folders, a symlinked one (or work tree) undone.
            real, top = Path(os.path.realpath(path)), Path(os.path.realpath(work_tree))
            if real.is_relative_to(top):  # else a folder linked out of it: git has no say
                missing.setdefault(work_tree, {})[real.relative_to(top).as_posix()] = source
    for work_tree, sources in missing.items():
        try:
            deleted = git_deleted(work_tree, sources)
        except NoGitAnswer as exc:
            found.unsure = str(exc)
            continue
        for path in deleted:
            found.gone[sources[path]] = found.absent.pop(sources[path])
    return found


def former_copies(
    client: RelayClient,
    former: Mapping[str, FormerName],
    drafts_by_source: Mapping[str, Sequence[ImportDraft]],
) -> dict[str, dict[str, dict]]:
    """The memories an import made under a file's `former` source (by an older release,
    when a remote's last two parts named its repository) that are copies of the file now,
    by that source. Another repository may bear that name today and import its own files
    under it (`infra/terraform` beside `platform/infra/terraform`), so only what the store
    shows came from this one counts: the former name holds no file this repository lacks
    (on disk, or deleted by its history), and the memory has the title and text of one of
    the file's sections as imported now. Without git's answer, none."""
    from relay.import_files import NoGitAnswer, git_deleted

    by_repository: dict[tuple[str, Path], list[str]] = {}
    for source, then in former.items():
        by_repository.setdefault((then.prefix, then.work_tree), []).append(source)
    copies: dict[str, dict[str, dict]] = {}
    for (prefix, work_tree), sources in by_repository.items():
        stored = [
            m for m in _list(client, {"source_prefix": prefix}) if _IMPORTED_ID.fullmatch(m["id"])
        ]
        paths = {PurePosixPath(m["source"][len(prefix) :]) for m in stored}
        if any(path.is_absolute() or ".." in path.parts for path in paths):
            continue  # no file of any work tree
        missing = {path.as_posix() for path in paths if not os.path.lexists(work_tree / path)}
        try:
            if missing - git_deleted(work_tree, missing):
                continue  # a file this repository never had: another's name too
        except NoGitAnswer:
            continue
        for source in sources:
            texts = {_text(d) for d in drafts_by_source[source]}
            was = former[source].source
            if same := {m["id"]: m for m in stored if m["source"] == was and _text(m) in texts}:
                copies[was] = same
    return copies


def continued_ids(drafts: Sequence[ImportDraft], live: Sequence[dict]) -> list[ImportDraft]:
    """Each draft under the id of the live memory (of its file) it continues, so that a
    section keeps its memory wherever it moves in the file, whatever id an older release
    gave it, and a memory no draft continues is retired. In order, a draft continues:

    1. a memory with its title and text: unchanged (its own id first, among twins);
    2. its own id, at its live generation (`imp_x.2` once retired and back): a section
       alone under its heading, edited;
    3. a memory with its text under another title: a heading renamed, a new description;
    4. the most alike memory under its title, if at least `ALIKE`: a rule or a section
       among namesakes, reworded.

    Any other draft is new, under its own id.
    """
    # Oldest generation first: of two live generations of one section (keys for different
    # audiences imported the file), the oldest is the one that continues.
    free = {
        m["id"]: m for m in sorted(live, key=lambda m: (_base_id(m["id"]), _generation(m["id"])))
    }
    chosen: list[str | None] = [None] * len(drafts)

    def claim(i: int, memory_id: str | None) -> None:
        if memory_id is not None and chosen[i] is None and memory_id in free:
            chosen[i] = memory_id
            del free[memory_id]

    def pick(key: Callable[[dict | ImportDraft], object]) -> None:
        """Each draft still free takes the first free memory with the same key."""
        by_key: dict[object, list[str]] = {}
        for memory_id, m in free.items():
            by_key.setdefault(key(m), []).append(memory_id)
        for i, d in enumerate(drafts):
            candidates = [c for c in by_key.get(key(d), ()) if c in free]
            claim(i, candidates[0] if candidates else None)

    own: dict[str, str] = {}
    for memory_id in free:
        own.setdefault(_base_id(memory_id), memory_id)
    mine = [own.get(d.id) for d in drafts]
    for i, d in enumerate(drafts):
        if mine[i] in free and _text(free[mine[i]]) == _text(d):
            claim(i, mine[i])
    pick(_text)
    for i, memory_id in enumerate(mine):
        claim(i, memory_id)
    pick(_body)
    for i, memory_id in _alike(drafts, chosen, free):
        claim(i, memory_id)

    taken = {_base_id(memory_id) for memory_id in chosen if memory_id}
    out = []
    for d, memory_id in zip(drafts, chosen, strict=True):
        if memory_id is None:
            memory_id = d.id
            while memory_id in taken:  # its own id continues another memory now: rare
                memory_id = "imp_" + hashlib.sha256(memory_id.encode()).hexdigest()[:16]
            taken.add(memory_id)
        out.append(dataclasses.replace(d, id=memory_id))
    return out


# How alike (difflib's ratio) a reworded rule must be to the memory it continues.
ALIKE = 0.6


def _alike(
    drafts: Sequence[ImportDraft], chosen: Sequence[str | None], free: Mapping[str, dict]
) -> list[tuple[int, str]]:
    """(draft, memory) pairs left over under one title, most alike first, at least ALIKE."""
    pairs = []
    for i, d in enumerate(drafts):
        for memory_id, m in free.items() if chosen[i] is None else ():
            if m["title"] == d.title:
                matcher = difflib.SequenceMatcher(None, m["body"], d.body)
                if matcher.real_quick_ratio() >= ALIKE and matcher.quick_ratio() >= ALIKE:
                    pairs.append((-matcher.ratio(), i, memory_id))
    found: list[tuple[int, str]] = []
    used: set[int | str] = set()
    for ratio, i, memory_id in sorted(pairs):
        if -ratio >= ALIKE and i not in used and memory_id not in used:
            used.update((i, memory_id))
            found.append((i, memory_id))
    return found


def _text(item: dict | ImportDraft) -> tuple[str | None, str]:
    return (item["title"], item["body"]) if isinstance(item, dict) else (item.title, item.body)


def _body(item: dict | ImportDraft) -> str:
    return item["body"] if isinstance(item, dict) else item.body


def _base_id(memory_id: str) -> str:
    match = _IMPORTED_ID.fullmatch(memory_id)
    return match.group(1) if match else memory_id


def _list(client: RelayClient, filters: dict[str, str]) -> Iterator[dict]:
    # id order, said outright: in `updated` order an edit meanwhile moves past the cursor
    query: dict[str, str | int] = {**filters, "limit": 500, "order": "id"}
    while True:
        page = client.get(f"/v1/memories?{urllib.parse.urlencode(query)}")
        yield from page["items"]
        if not page["next_cursor"]:
            return
        query["cursor"] = page["next_cursor"]


def _upsert(
    client: RelayClient,
    batch: list[ImportDraft],
    audiences: Sequence[str],
    read: Mapping[str, int],
) -> tuple[dict, list[tuple[ImportDraft, ImportDraft]], list[ImportDraft]]:
    """The batch written: (the server's counts, (draft, as sent) for each written: a section
    deleted before goes at its id's next generation, and the drafts left unwritten because
    their memory moved past the revision `read` holds, or out of this key's sight)."""
    pairs = [(d, d) for d in batch]
    changed: list[ImportDraft] = []
    while pairs:
        items = [_item(d, audiences, read.get(d.id)) for _, d in pairs]
        try:
            return client.post("/v1/memories/batch", {"items": items}), pairs, changed
        except ConflictError as exc:
            # The batch wrote nothing: sent again without the refused item, or with it moved.
            taken = exc.details.get("memory_id")
            if not any(d.id == taken for _, d in pairs):
                raise
            # Changed since it was read: left as it is. A memory read live is changed too
            # when refused as one this key may not read (narrowed meanwhile to a role the
            # key lacks; the 409 names no revision): written at the next generation, it
            # would be a copy for the wider audiences read before.
            if "revision" in exc.details or taken in read:
                changed += [was for was, d in pairs if d.id == taken]
                pairs = [(was, d) for was, d in pairs if d.id != taken]
                continue
            # A new section's id is taken: retired before (its tombstone keeps the id), or
            # held by a memory this key may not read. Rare, so only now is that section
            # moved to the id's next generation, and the batch sent again.
            pairs = [
                (was, dataclasses.replace(d, id=_next_generation(d.id)) if d.id == taken else d)
                for was, d in pairs
            ]
        except RelayError as exc:
            raise _named(exc, [d for _, d in pairs]) from None
    return {"written": 0, "unchanged": 0}, [], changed


def _named(exc: RelayError, sent: list[ImportDraft]) -> RelayError:
    """The server's refusal of a batch item, naming its file and section (as the import's
    notes do) where the server, which knows only the batch, says `items.N`."""
    item = exc.details.get("item")
    if not (isinstance(item, int) and 0 <= item < len(sent)):
        return exc
    draft = sent[item]
    message = exc.message.removeprefix(f"items.{item}: ")
    return type(exc)(f"{draft.source} › {draft.title or draft.id}: {message}", **exc.details)


def _next_generation(memory_id: str) -> str:
    """`imp_x` -> `imp_x.2`, `imp_x.2` -> `imp_x.3`: where a section whose id is taken goes."""
    return f"{_base_id(memory_id)}.{_generation(memory_id) + 1}"


def _generation(memory_id: str) -> int:
    """`imp_x` -> 1, `imp_x.2` -> 2 (any other id: 1)."""
    base = _base_id(memory_id)
    return int(memory_id[len(base) + 1 :]) if memory_id != base else 1


def check_drafts(
    drafts: Iterable[ImportDraft],
    audiences: Sequence[str] = (),
    owned: Callable[[str], Sequence[dict]] = lambda _: (),
) -> None:
    """Judge every draft as the server will (`relay.writes.draft_from_fields`, on the item
    the batch will carry), before anything is written. The server names a rejected item
    only by its place in a batch; here the error names the file and section, and one bad
    section stops the whole import, not only the batch it would have travelled in.

    An invisible format character or a line separator in a source (a file's name) or a tag
    is judged as the server does, against the memory the draft continues
    (`hygiene.check_format_characters`): one an older release stored there is kept, and
    only a draft holding one asks `owned` (`owned_memories`) for its file's memories, to
    learn which it continues (`continued_ids`). A draft that continues none would give it
    to a new memory, which the server refuses: so is it here, saying what to do."""
    from relay.hygiene import check_format_characters
    from relay.writes import draft_from_fields

    drafts = list(drafts)
    owned_by: dict[str, list[dict]] = {}  # source -> its memories, asked once
    continued: dict[str, dict[int, dict]] = {}  # source -> a draft's place -> its memory

    def held(place: int, source: str) -> dict | None:
        """The memory the draft at `place` in `drafts` continues, or None."""
        if source not in continued:
            owned_by[source] = list(owned(source))
            places = [i for i, d in enumerate(drafts) if d.source == source]
            ids = [d.id for d in continued_ids([drafts[i] for i in places], owned_by[source])]
            live = {m["id"]: m for m in owned_by[source]}
            continued[source] = {i: live[m] for i, m in zip(places, ids, strict=True) if m in live}
        return continued[source].get(place)

    seen: dict[str, int] = {}
    for place, draft in enumerate(drafts):
        seen[draft.source] = seen.get(draft.source, 0) + 1
        try:
            # The org's audiences: the server's to judge.
            judged = draft_from_fields(_item(draft, audiences))
            try:
                check_format_characters(judged.source, judged.tags)
            except InvalidRequestError as exc:
                memory = held(place, draft.source)
                if memory is not None:
                    check_format_characters(
                        judged.source, judged.tags, memory["source"], memory["tags"]
                    )
                elif exc.details.get("field") == "source":
                    raise _rename(exc, bool(owned_by[draft.source])) from None
                else:
                    raise
        except InvalidRequestError as exc:
            message = f"{draft_label(draft, seen[draft.source])}: {exc.message}"
            raise type(exc)(message, **exc.details) from None


def _rename(exc: InvalidRequestError, imported_before: bool) -> InvalidRequestError:
    """`exc`, a refusal of a file's source, saying what to do: the source is the file's
    path, so the file (or a folder above it) is what to rename; and, when memories the file
    was imported to before hold it (stored by an older release), why they may keep it but
    this section may not take it."""
    why = (
        "; the memories imported from this file before keep its name (an older release"
        " stored it), but this section would be a new memory, which may not take it"
        if imported_before
        else ""
    )
    return type(exc)(
        f"{exc.message}{why}. The source is the file's path: rename the file (or the folder"
        " holding it) and import it again",
        **exc.details,
    )


def _item(d: ImportDraft, audiences: Sequence[str], revision: int | None = None) -> dict:
    """The batch item for `d`: for `audiences` (--audience), else for those of the memory
    it continues, else (left out) for everyone; written only over `revision` when given."""
    chosen = list(audiences or d.audiences)
    return {
        "id": d.id,
        "body": d.body,
        "title": d.title,
        "source": d.source,
        "tags": list(d.tags),
        **({"audiences": chosen} if chosen else {}),
        **({"expected_revision": revision} if revision is not None else {}),
    }
