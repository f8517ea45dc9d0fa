"""The write path: validate, split into passages, embed (once per distinct text), store.

Validation happens before anything touches the database and the store writes
a memory, its revision, passages and index entries in one transaction, so a
rejected or failed write leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from relay import auth, hygiene, late
from relay.embedding import Embedder
from relay.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    RelayError,
    StoreError,
    UnavailableError,
)
from relay.ids import MEMORY_ID
from relay.models import EVERYONE, Memory, MemoryDraft, PassageInput, Principal
from relay.passages import split_passages
from relay.store import SaveMode, Store
from relay.text import lexical_terms

log = logging.getLogger(__name__)

EMBED_BATCH = 64


def new_memory_id() -> str:
    return "mem_" + secrets.token_hex(8)


def check_memory_id(memory_id: str) -> str:
    """`memory_id` from a path or a tool call, or 404 before the store is asked: text that
    cannot be an id names no memory, and a NUL in it failed PostgreSQL's query (a 500)
    where SQLite found nothing."""
    if not MEMORY_ID.fullmatch(memory_id):
        raise NotFoundError(f"no memory {memory_id!r}")
    return memory_id


def draft_from_fields(
    fields: Mapping[str, Any],
    known_audiences: set[str] | None = None,
    now: datetime | None = None,
    past_expiry: bool = False,
) -> MemoryDraft:
    """Check every user-supplied field; the one place a write is judged, but for what is
    judged against the memory it would replace, where the store reads it (`relay.store.rules`).

    `known_audiences` are the roles the org's keys carry; an audience outside them would
    hide the memory from everyone, so it is refused. `past_expiry`: a `valid_until` that
    has passed is left for the store to judge against the memory it would replace, whose
    own it may be (`rules.settle_expiry`: an edit, a batch item); else it is refused here.
    An invisible format character in the source or a tag is the store's to judge too
    (`rules.judge_format_characters`): the memory may hold it from an older release.
    """
    now = now or datetime.now(UTC)
    if isinstance(fields.get("id"), str):  # the shape is the caller's (API model, restore)
        hygiene.check_given_id(fields["id"])
    audiences = fields.get("audiences")
    if audiences is None:  # left out: everyone; an empty list is refused, never widened
        audiences = [EVERYONE]
    supersedes = fields.get("supersedes") or []
    if not isinstance(supersedes, list | tuple) or not all(isinstance(s, str) for s in supersedes):
        raise InvalidRequestError("supersedes must be a list of memory ids")
    for target in supersedes:
        if not MEMORY_ID.fullmatch(target):  # the store's words for an id it does not hold
            raise InvalidRequestError(
                f"supersedes names {target!r}, which is not a memory of this organisation",
                field="supersedes",
            )
    return MemoryDraft(
        body=hygiene.check_body(fields.get("body") or ""),
        title=hygiene.check_title(fields.get("title")),
        source=hygiene.check_source(fields.get("source")),
        audiences=hygiene.check_audiences(audiences, known_audiences),
        tags=hygiene.check_tags(fields.get("tags") or []),
        valid_until=hygiene.check_valid_until(fields.get("valid_until"), now, past_expiry),
        supersedes=tuple(dict.fromkeys(supersedes)),
        pinned=bool(fields.get("pinned", False)),
    )


def edited_draft(
    current: Memory,
    changes: Mapping[str, Any],
    known_audiences: set[str],
    now: datetime | None = None,
) -> MemoryDraft:
    """`current` with a PATCH's `changes` applied and judged like any write (API, console).

    A field left out keeps its value; null clears an optional one (title, source,
    valid_until, tags, supersedes; the request model refuses null for body, audiences and
    pinned); an empty list is no tags or no supersedes, and no audiences is refused. The
    memory's own audiences stay acceptable after the last key holding one is revoked:
    fixing a typo must not require re-addressing the memory. Its expiry, left out or sent
    back unchanged, stays as it was even if past (the store judges it: `rules.settle_expiry`):
    editing an expired memory's text must not require inventing a new date. So do a source
    and tags stored with an invisible format character by an older release, judged by the
    store (`rules.judge_format_characters`): its body must be editable without them.
    """
    fields: dict[str, Any] = {
        "body": current.body,
        "title": current.title,
        "source": current.source,
        "audiences": list(current.audiences),
        "tags": list(current.tags),
        "valid_until": current.valid_until,
        "supersedes": list(current.supersedes),
        "pinned": current.pinned,
        **changes,
    }
    return draft_from_fields(fields, known_audiences | set(current.audiences), now, True)


def embedding_text(title: str | None, passage: str) -> str:
    return f"{title}\n{passage}" if title else passage


def content_digest(to_embed: str) -> str:
    """The embedding cache's key for a text: the same content gets the same embedding."""
    return hashlib.sha256(to_embed.encode()).hexdigest()


@dataclass
class PreparedWrite:
    memory_id: str
    draft: MemoryDraft
    passages: list[PassageInput]


# Embeddings made for a write, by model then content digest: cached once the write is stored.
NewEmbeddings = dict[str, dict[str, bytes]]


def prepare(
    store: Store,
    embedder: Embedder,
    items: Sequence[tuple[str, MemoryDraft]],
    org_id: str,
    audiences: frozenset[str] | None,
) -> tuple[list[PreparedWrite], NewEmbeddings]:
    """Split and embed many drafts at once: distinct texts are embedded once, in batches,
    and texts embedded before (same model, same content) come from the store's cache, as far
    as the writer's org holds them in memories `audiences` may read (a cache hit is quicker
    to answer: one held elsewhere told the writer that text exists where it cannot look). The
    new embeddings are returned for `cache_new`, not cached here: a write the store then
    refuses must leave nothing behind, its text's vectors included."""
    pending: list[tuple[str, MemoryDraft, list[tuple[str, str, str]]]] = []
    for memory_id, draft in items:
        parts = []
        for text in split_passages(draft.body):
            to_embed = embedding_text(draft.title, text)
            digest = content_digest(to_embed)
            parts.append((text, to_embed, digest))
        pending.append((memory_id, draft, parts))
    wanted = {digest: to_embed for _, _, parts in pending for _, to_embed, digest in parts}
    tokens_model = late.cache_model(embedder.name)
    vectors = store.cached_embeddings(embedder.name, list(wanted), org_id, audiences)
    tokens = store.cached_embeddings(tokens_model, list(wanted), org_id, audiences)
    missing = [d for d in wanted if d not in vectors or d not in tokens]
    fresh: dict[str, bytes] = {}
    fresh_tokens: dict[str, bytes] = {}
    for start in range(0, len(missing), EMBED_BATCH * 8):
        chunk = missing[start : start + EMBED_BATCH * 8]
        matrix, states = embedder.embed_tokens([wanted[d] for d in chunk])
        matrix = matrix.astype("<f4")
        fresh.update({d: matrix[i].tobytes() for i, d in enumerate(chunk)})
        fresh_tokens.update({d: late.pack(states[i]) for i, d in enumerate(chunk)})
    vectors.update(fresh)
    tokens.update(fresh_tokens)
    prepared = []
    for memory_id, draft, parts in pending:
        passages = [
            PassageInput(
                seq=i,
                text=text,
                lexical=" ".join(lexical_terms(embedding_text(draft.title, text))),
                content_hash=digest,
                embedding=vectors[digest],
                tokens=tokens[digest],
            )
            for i, (text, _, digest) in enumerate(parts)
        ]
        prepared.append(PreparedWrite(memory_id, draft, passages))
    return prepared, {embedder.name: fresh, tokens_model: fresh_tokens}


def cache_new(store: Store, embeddings: NewEmbeddings) -> None:
    """Keep a stored write's new embeddings, so the same text is never embedded again while
    a passage holds it (the store drops an entry with its last passage). Only a cache, kept
    after the write committed: a failure here (a full disk) is logged, not raised, since a
    write answered as failed is sent again, and a memory without an id of its own twice."""
    try:
        for model, items in embeddings.items():
            if items:
                store.cache_embeddings(model, items)
    except (StoreError, UnavailableError) as exc:
        log.warning("a stored write's embeddings were not cached (made again if needed): %s", exc)


def create(
    store: Store,
    embedder: Embedder,
    principal: Principal,
    fields: dict[str, Any],
    memory_id: str | None = None,
) -> Memory:
    """A new memory written by `principal` (API, MCP, console): its fields checked, an id
    made unless given, and what it supersedes judged against what the key may read."""
    if memory_id is not None:
        fields = {**fields, "id": memory_id}  # judged with the rest, whoever chose it
    draft = draft_from_fields(fields, store.known_audiences(principal.org_id))
    memory, _ = save(
        store,
        embedder,
        principal.org_id,
        memory_id or new_memory_id(),
        draft,
        principal.key_id,
        "create",
        audiences=auth.management_view(principal),
    )
    return memory


def write_answer(principal: Principal, memory: Memory) -> dict[str, Any]:
    """The answer to a create or edit by `principal` (API, console, MCP): the memory, and
    `warnings` when there is something the writer must know. Writing for audiences the key
    does not read is allowed (a memory for another team), but the key then loses it: reads
    by id, lists, edits and search all pass it by, so the answer says so (QA: an edit that
    narrowed a memory away from the writer's roles succeeded without a word, and the next
    read was a 404)."""
    answer = memory.to_dict()
    if (view := _lost_to(principal, memory.audiences)) is None:
        return answer
    answer["warnings"] = [
        f"this key cannot read memory {memory.id} now: it is for {', '.join(memory.audiences)},"
        f" and the key reads {', '.join(sorted(view))}; it is saved, but this key will not"
        " find, list or edit it again (a key with one of its audiences, or an admin key, can)"
    ]
    return answer


# How many of the memories a batch wrote out of its key's sight its warning names.
SHOWN_LOST = 5


def batch_answer(
    principal: Principal, items: Sequence[tuple[str, MemoryDraft]], written: int, unchanged: int
) -> dict[str, Any]:
    """The answer to a batch by `principal`: its counts, and `warnings` as `write_answer`'s
    when it wrote memories the key cannot read. Such an item was a new memory (one taken
    by a memory the key cannot read is refused), and a batch naming its id again is refused
    as taken: sent again, as an import does on every run, it cannot be kept in step."""
    answer: dict[str, Any] = {"written": written, "unchanged": unchanged}
    lost = [(i, d) for i, d in items if _lost_to(principal, d.audiences) is not None]
    if not lost:
        return answer
    view = sorted(auth.management_view(principal) or ())
    shown = ", ".join(f"{i} (for {', '.join(d.audiences)})" for i, d in lost[:SHOWN_LOST])
    more = f" and {len(lost) - SHOWN_LOST} more" if len(lost) > SHOWN_LOST else ""
    answer["warnings"] = [
        f"this key cannot read {len(lost)} of the memories this batch wrote now: {shown}{more};"
        f" the key reads {', '.join(view)}. They are saved, but this key will not find, list"
        " or edit them again, and a batch naming their ids again is refused as taken (a key"
        " with one of their audiences, or an admin key, can)"
    ]
    return answer


def _lost_to(principal: Principal, audiences: Sequence[str]) -> frozenset[str] | None:
    """What `principal` reads, when that leaves out a memory for `audiences`; else None.
    Never said to an admin key, which manages every memory, nor to a key without
    memory:read, which reads none."""
    view = auth.management_view(principal)
    if view is None or "memory:read" not in principal.scopes or set(audiences) & view:
        return None
    return view


# How many times an edit is rebuilt on a newer revision before it gives up with a 409.
EDIT_ATTEMPTS = 12


def edit(
    store: Store,
    embedder: Embedder,
    principal: Principal,
    memory_id: str,
    changes: Mapping[str, Any],
    expected_revision: int | None = None,
) -> Memory:
    """A PATCH (API, console): `changes` applied to the revision it replaces, never to an
    older one. The whole draft is built from the memory as read, so it is saved only if
    the memory is still at that revision; when another write landed in between, it is read
    and built again, so two edits at once each keep what the other changed (a title edit
    must not put back the audiences a narrowing edit just took away). A client that sent
    its own `expected_revision` asked to fail instead: it gets the 409. The embedding is
    made again only when the text it is made from (title and body) changed."""
    view = auth.management_view(principal)
    prepared: PreparedWrite | None = None
    embeddings: NewEmbeddings = {}
    for _ in range(EDIT_ATTEMPTS):
        current = store.get_memory(principal.org_id, memory_id, view)
        draft = edited_draft(current, changes, store.known_audiences(principal.org_id))
        if prepared is None or (prepared.draft.title, prepared.draft.body) != (
            draft.title,
            draft.body,
        ):
            (prepared,), embeddings = prepare(
                store, embedder, [(memory_id, draft)], principal.org_id, view
            )
        try:
            memory, _ = store.save_memory(
                principal.org_id,
                memory_id,
                draft,
                principal.key_id,
                prepared.passages,
                "edit",
                current.revision if expected_revision is None else expected_revision,
                view,
            )
        except ConflictError:
            if expected_revision is not None:
                raise
            continue  # moved on (or was deleted) since it was read: read it again
        cache_new(store, embeddings)
        return memory
    raise ConflictError(
        f"memory {memory_id!r} changed {EDIT_ATTEMPTS} times while this edit was being saved;"
        " send it again",
        memory_id=memory_id,
    )


def save(
    store: Store,
    embedder: Embedder,
    org_id: str,
    memory_id: str,
    draft: MemoryDraft,
    author: str | None,
    mode: SaveMode,
    expected_revision: int | None = None,
    audiences: frozenset[str] | None = None,
) -> tuple[Memory, bool]:
    (write,), embeddings = prepare(store, embedder, [(memory_id, draft)], org_id, audiences)
    saved = store.save_memory(
        org_id, memory_id, draft, author, write.passages, mode, expected_revision, audiences
    )
    cache_new(store, embeddings)
    return saved


def save_many(
    store: Store,
    embedder: Embedder,
    org_id: str,
    items: Sequence[tuple[str, MemoryDraft]],
    author: str | None,
    mode: SaveMode = "upsert",
    progress: Callable[[int], None] | None = None,
    batch: int = 512,
    audiences: frozenset[str] | None = None,
    expected: Mapping[str, int] | None = None,
    known: Collection[str] | None = None,
) -> tuple[int, int]:
    """Bulk write (import, benchmarks): returns (written, unchanged). `expected`: memory id
    -> the revision its writer read it at; the write is refused (ConflictError with
    `revision`) when another landed since, as an edit's `expected_revision` is. `known`:
    the org's audiences, each item judged against them and its memory's own (the store's
    `judge_audiences`), as an edit is."""
    written = unchanged = 0
    for start in range(0, len(items), batch):
        chunk = items[start : start + batch]
        prepared, embeddings = prepare(store, embedder, chunk, org_id, audiences)
        try:
            saved = store.save_memories(
                org_id,
                [(w.memory_id, w.draft, w.passages) for w in prepared],
                author,
                mode,
                audiences,
                expected,
                known,
            )
        except RelayError as exc:
            if exc.item is not None:  # its place in the chunk, made its place in `items`
                exc.item += start
            raise
        cache_new(store, embeddings)
        written += sum(changed for _, changed in saved)
        unchanged += sum(not changed for _, changed in saved)
        if progress:
            progress(len(chunk))
    return written, unchanged


def backfill_tokens(
    store: Store, embedder: Embedder, batch: int = EMBED_BATCH * 4
) -> Iterator[int]:
    """Give every stored passage without a token matrix (written before relay.late existed)
    its matrix, `batch` at a time, in passage order; yields how many each step stored. Until
    a query's proposals all have theirs, search chooses its candidates by rank fusion and
    scores them with the cosine-only model. Like a write, it embeds each distinct text once
    and keeps its matrix in the embedding cache: a text repeated across memories or orgs
    costs one embedding, and a later edit that keeps a passage finds its matrix there."""
    tokens_model = late.cache_model(embedder.name)
    after = 0
    while rows := store.missing_tokens(batch, after):
        texts = [embedding_text(title, text) for _, title, text in rows]
        digests = [content_digest(t) for t in texts]
        wanted = dict(zip(digests, texts, strict=True))
        matrices = store.cached_embeddings(tokens_model, list(wanted))
        missing = [d for d in wanted if d not in matrices]
        if missing:
            _, states = embedder.embed_tokens([wanted[d] for d in missing])
            fresh = {d: late.pack(s) for d, s in zip(missing, states, strict=True)}
            store.cache_embeddings(tokens_model, fresh)
            matrices.update(fresh)
        store.store_tokens([(row[0], matrices[d]) for row, d in zip(rows, digests, strict=True)])
        after = rows[-1][0]
        yield len(rows)
