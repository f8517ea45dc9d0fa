"""The write rules every store applies, in one place, so both stores refuse the same writes
with the same words."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import NamedTuple, TypeVar

from relay.errors import ConflictError, InvalidRequestError, NotFoundError
from relay.hygiene import check_audiences, check_format_characters, check_valid_until
from relay.models import EVERYONE, ApiKey, Memory, MemoryDraft, Revision, iso
from relay.store import SaveMode

Read = TypeVar("Read", Memory, Revision)


class LinkTarget(NamedTuple):
    """A memory of the org that a write's supersedes names, as stored: its audiences (a
    deleted one's last) and, once deleted, when and its tombstone's revision."""

    audiences: Sequence[str]
    deleted_at: datetime | None = None
    revision: int = 0

    @property
    def live(self) -> bool:
        return self.deleted_at is None


def judge_write(
    current: Memory | None,
    deleted: bool,
    memory_id: str,
    mode: SaveMode,
    expected_revision: int | None,
    audiences: frozenset[str] | None,
) -> None:
    """Raise unless a write of `mode` may go ahead against the stored `current` memory
    (`deleted`: its tombstone, which keeps the audiences of its last live revision).

    Ids are unique in the org and never reused, so a taken id is refused whoever may read
    its memory. One the writer may not read is refused before anything else is looked at,
    with one answer whether it lives or was deleted: an edit's 404 (as for an id never
    used), any other write's 409 naming the id (so `relay import` takes the id's next
    generation). Only a reader of the memory is told which it is."""
    if current is not None and not _reads(audiences, current.audiences):
        if mode == "edit":
            raise NotFoundError(f"no memory {memory_id!r}", memory_id=memory_id)
        raise ConflictError(
            f"id {memory_id!r} is taken by a memory for audiences this key lacks"
            " (a deleted memory's id stays taken too)",
            memory_id=memory_id,
        )
    if deleted:
        raise ConflictError(
            f"memory {memory_id!r} was deleted; its id cannot be reused", memory_id=memory_id
        )
    if mode == "create" and current is not None:
        raise ConflictError(f"memory {memory_id!r} already exists", memory_id=memory_id)
    if mode == "edit" and current is None:
        raise NotFoundError(f"no memory {memory_id!r}", memory_id=memory_id)
    # (A deleted memory was refused above, "was deleted", as any write to its id is.)
    judge_revision(memory_id, None if current is None else current.revision, expected_revision)


def judge_revision(memory_id: str, have: int | None, expected: int | None) -> None:
    """Raise unless the memory, at revision `have` (None: there is none), is at the revision
    its writer read it at, `expected` (None: no check): a write or delete made on what it
    read must not undo a change that landed since, unseen."""
    if expected is None or have == expected:
        return
    said = (
        f"does not exist (expected at revision {expected})"
        if have is None
        else f"is at revision {have}, not {expected}"
    )
    # `revision` tells this refusal from a taken id's (the batch's writer re-reads it).
    raise ConflictError(f"memory {memory_id!r} {said}", memory_id=memory_id, revision=have)


def judge_audiences(
    draft: MemoryDraft, current: Memory | None, known: Collection[str] | None
) -> None:
    """Raise unless each of the draft's audiences is a role some live key carries (`known`;
    None: not judged here) or one the memory already has. Once the last key holding a role
    is revoked or expires, its memories may still be written back as they are (an import
    of their file, a restore of their backup), as a `relay edit` may: what they must not
    gain is an audience nobody could read. Judged where the memory is read for the write,
    so an audience it has lost meanwhile is not accepted on its account."""
    if known is not None:
        check_audiences(draft.audiences, {*known, *(current.audiences if current else ())})


def judge_format_characters(draft: MemoryDraft, current: Memory | None) -> None:
    """Raise if the draft gives the memory a source or a tag holding an invisible format
    character (a bidi override...), or a source holding a line separator (U+2028), that it
    does not hold already: one stored by an older release, before such characters were
    refused, stays through an edit of another field, an import or a restore of the memory
    as it is (`hygiene.check_format_characters`). Judged where the memory is read for the
    write, as `judge_audiences` is."""
    if current is None:
        check_format_characters(draft.source, draft.tags)
    else:
        check_format_characters(draft.source, draft.tags, current.source, current.tags)


def judge_revoke(keys: Iterable[ApiKey], key_id: str) -> None:
    """Raise unless `key_id` may be revoked among the org's `keys`, read in the revoking
    write transaction (so two revokes at once cannot both pass): never its last live admin
    key, which would leave no key able to make or revoke keys (an admin revoking itself
    over HTTP did). Live is by this process's clock, as `auth.authorize` judges a key."""
    now = datetime.now(UTC)
    live_admins = {
        k.id
        for k in keys
        if "admin" in k.scopes
        and k.revoked_at is None
        and (k.expires_at is None or k.expires_at > now)
    }
    if live_admins == {key_id}:
        raise ConflictError(
            f"key {key_id} is this organisation's last live admin key: without it no key could"
            " create or revoke keys; create another admin key first, then revoke this one",
            key_id=key_id,
        )


def settle_expiry(draft: MemoryDraft, current: Memory | None) -> MemoryDraft:
    """The draft as it may be saved, or raise: a `valid_until` that is the memory's own as
    the API shows it (to the second: an export, a form, a batch sent back as it was read)
    is kept as stored, even once passed, so re-sending an expired memory unchanged changes
    nothing, and its text may be fixed without inventing a date. Any other must be in the
    future, judged now, in the write's transaction."""
    until = draft.valid_until
    if until is None:
        return draft
    if current is not None and iso(current.valid_until) == iso(until):
        return dataclasses.replace(draft, valid_until=current.valid_until)
    check_valid_until(until)
    return draft


def same_content(current: Memory, draft: MemoryDraft) -> bool:
    """True when saving `draft` would change nothing: no new revision is made."""
    return (
        current.body == draft.body
        and current.title == draft.title
        and current.source == draft.source
        and tuple(current.audiences) == tuple(draft.audiences)
        and tuple(current.tags) == tuple(draft.tags)
        and current.valid_until == draft.valid_until
        and tuple(current.supersedes) == tuple(draft.supersedes)
        and current.pinned == draft.pinned
    )


def _reads(writer: frozenset[str] | None, audiences: Sequence[str]) -> bool:
    """May `writer` (None: an admin, who reads every memory) read what `audiences` reach."""
    return writer is None or bool(set(audiences) & (writer | {EVERYONE}))


def judge_supersedes(
    memory_id: str,
    targets: Sequence[str],
    stored: Mapping[str, LinkTarget],
    writer: frozenset[str] | None,
    audiences: Sequence[str],
    kept: Collection[str],
) -> None:
    """Raise unless the memory may supersede `targets`; `stored` maps the org's memories
    among them, `writer` the writing key's audiences (None: admin), `kept` the targets the
    memory already supersedes (an edit carries them over).

    A new target the writer may not read is answered exactly like one that does not exist
    (no existence test, no hiding another audience's memory); a deleted one it may read is
    named as deleted, as its history shows it. The memory must reach
    everyone its live targets reached: recall never returns a superseded memory, so a
    narrower replacement would take the fact away from the readers it leaves out. A kept
    target is not judged again for existence or access: it may have been deleted since,
    or be one this writer cannot read, and an edit of the title must not fail on either.
    A kept target the writer cannot read is judged by its audiences whether it still lives
    or not, so a narrowing edit's answer never tells whether it was deleted."""
    reach = set(audiences)
    for target in targets:
        if target == memory_id:
            raise InvalidRequestError("a memory cannot supersede itself", field="supersedes")
        found = stored.get(target)
        target_audiences = () if found is None else found.audiences
        live = found is not None and found.live
        readable = _reads(writer, target_audiences)
        if target in kept:
            if readable and not live:
                continue  # deleted since, as the writer may see: the link takes nothing
        elif found is not None and readable and not live:
            raise InvalidRequestError(
                f"supersedes names {target!r}, which was deleted at {iso(found.deleted_at)}"
                f" (revision {found.revision}): recall no longer returns it, so there is"
                " nothing to supersede; leave it out",
                field="supersedes",
            )
        elif not (live and readable):
            raise InvalidRequestError(
                f"supersedes names {target!r}, which is not a memory of this organisation",
                field="supersedes",
            )
        left_out = set() if EVERYONE in reach else (set(target_audiences) - reach)
        if left_out:
            raise InvalidRequestError(
                f"{target!r} reaches {', '.join(sorted(left_out))}, which this memory would not:"
                " give it those audiences too, or leave it unsuperseded"
                if readable
                else "this memory already supersedes one that reaches audiences it would"
                " no longer reach: keep its audiences"
            )


def carried_links(
    targets: Sequence[str],
    kept: Sequence[str],
    stored: Mapping[str, LinkTarget],
    writer: frozenset[str] | None,
) -> tuple[str, ...]:
    """The links a write saves: `targets`, then every link the memory already has (`kept`)
    to a memory the writer may not read, which no list it sends can drop; `stored` as for
    `judge_supersedes`.

    Dropping such a link would bring the superseded memory back into its own readers'
    recall on the word of a key that cannot see it. Whether it is carried depends on its
    audiences alone, never on whether it is still live (a deleted one is carried too, and
    an id with no memory at all), so the answer tells the writer nothing it could not read.
    An admin (`writer` None) reads every memory and carries nothing over."""
    hidden = [
        t
        for t in kept
        if t not in targets and not _reads(writer, stored.get(t, LinkTarget(())).audiences)
    ]
    if hidden and tuple(targets) == tuple(t for t in kept if t not in hidden):
        return tuple(kept)  # the links as the writer was shown them (`as_read`): no change
    return (*targets, *hidden)


def settle_supersedes(
    memory_id: str,
    draft: MemoryDraft,
    stored: Mapping[str, LinkTarget],
    writer: frozenset[str] | None,
    kept: Sequence[str],
) -> MemoryDraft:
    """The draft as it may be saved: its links with those it cannot drop carried over
    (`carried_links`), then judged (`judge_supersedes`). `stored` maps the memories of the
    org among the draft's and the `kept` links."""
    links = carried_links(draft.supersedes, kept, stored, writer)
    judge_supersedes(memory_id, links, stored, writer, draft.audiences, kept)
    return draft if links == draft.supersedes else dataclasses.replace(draft, supersedes=links)


def judge_cycle(
    memory_id: str,
    links: Sequence[str],
    kept: Collection[str],
    reached: Mapping[str, tuple[Sequence[str], Sequence[str]]],
    writer: frozenset[str] | None,
) -> None:
    """Raise when a new link of the memory (one of `links` not in `kept`) would close a cycle:
    its target already reaches `memory_id` by following `supersedes`. `reached` maps the org's
    live memories the new targets reach that way, stopping at `memory_id`, to (supersedes,
    audiences), every link counted, those the writer cannot read too; `writer` as for
    `judge_supersedes`.

    Every memory in a cycle is superseded by another, so recall would show none of them. A
    kept link is not judged: a cycle written before this rule stays until an edit drops one
    of its links, and any edit of its memories must be able to. A path through memories
    the writer may not read is not named. The refusal names the link in `closes_cycle` too,
    for a client (`relay restore`) to drop it without reading the message."""
    for target in links:
        if target in kept:
            continue
        path = _path(target, memory_id, reached)
        if path is None:
            continue
        if all(_reads(writer, reached[m][1]) for m in path[1:-1]):
            chain = " -> ".join(repr(m) for m in [memory_id, *path])
            raise InvalidRequestError(
                f"supersedes names {target!r}, which would close a cycle of supersedes links"
                f" ({chain}), and recall shows no memory in a cycle: drop one of its links",
                closes_cycle=target,
            )
        raise InvalidRequestError(
            f"supersedes names {target!r}, which would close a cycle of supersedes links"
            " through memories this key cannot read, and recall shows no memory in a cycle",
            closes_cycle=target,
        )


def _path(
    start: str, goal: str, reached: Mapping[str, tuple[Sequence[str], Sequence[str]]]
) -> list[str] | None:
    """A shortest chain of `supersedes` links from `start` to `goal` in `reached`, or None."""
    came: dict[str, str | None] = {start: None}
    queue = [start]
    for node in queue:
        if node == goal:
            path = [node]
            while (prev := came[path[-1]]) is not None:
                path.append(prev)
            return path[::-1]
        for nxt in reached.get(node, ((), ()))[0]:
            if nxt not in came:
                came[nxt] = node
                queue.append(nxt)
    return None


def judge_replacement(
    memory_id: str,
    before: Sequence[str],
    audiences: Sequence[str],
    replacements: Sequence[tuple[str, Sequence[str]]],
    writer: frozenset[str] | None,
) -> None:
    """Raise unless a memory superseded by the live `replacements` ((id, audiences), the
    one its `superseded_by` names first) may go from audiences `before` to `audiences`;
    `writer` as for `judge_supersedes`.

    A superseded memory never reaches recall, so an audience it gains that one of its
    replacements does not reach would find neither: the rule `judge_supersedes` holds a
    replacement to, from the other side. Each replacement is judged, not only the one
    `superseded_by` names: once that one goes, the next stands in its place. Only audiences
    it gains are judged, so an edit that widens nothing never fails on a pair written
    before this rule. A writer that may not read a replacement (only such a pair can leave
    it so) is refused any new audience, whichever the replacement reaches, so that the
    answer says nothing of them."""
    gained = set(audiences) - set(before)
    if not gained:
        return
    for replacement, reach in replacements:
        if EVERYONE in reach:
            continue
        if not _reads(writer, reach):
            raise InvalidRequestError(
                "this memory is superseded by one this key cannot read: keep its audiences"
            )
        left_out = gained - set(reach)
        if left_out:
            raise InvalidRequestError(
                f"{replacement!r} supersedes this memory and does not reach"
                f" {', '.join(sorted(left_out))}: give it those audiences first, or drop its"
                f" link to {memory_id!r}"
            )


def linked_ids(items: Iterable[Memory | Revision]) -> set[str]:
    """Every memory id the `supersedes` and `superseded_by` of `items` name."""
    ids: set[str] = set()
    for item in items:
        ids.update(item.supersedes)
        if isinstance(item, Memory) and item.superseded_by is not None:
            ids.add(item.superseded_by)
    return ids


def as_read(item: Read, readable: Collection[str]) -> Read:
    """A memory or revision as a reader sees it, `readable` being which of its links
    (`linked_ids`) name memories the reader may read (a deleted one by its last audiences).

    A link to any other memory is withheld: `supersedes` leaves it out and
    `supersedes_withheld` counts it (those are the links a write by the reader carries
    over, `carried_links`), and `superseded_by` is null. What the link named would tell
    the reader of a memory it may not read, and whether that memory still lives."""
    shown = tuple(t for t in item.supersedes if t in readable)
    if (
        isinstance(item, Memory)
        and item.superseded_by is not None
        and item.superseded_by not in readable
    ):
        item = dataclasses.replace(item, superseded_by=None)
    if len(shown) == len(item.supersedes):
        return item
    return dataclasses.replace(
        item, supersedes=shown, supersedes_withheld=len(item.supersedes) - len(shown)
    )
