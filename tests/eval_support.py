"""A small team dataset for the replay tests, in ../shared/bench format, and a PNG reader."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

MEMORIES = [
    (
        "team:migrations",
        "Database migrations are written by hand with make migration; we never use Alembic "
        "autogenerate, and an applied database migration is never edited.",
    ),
    (
        "team:staging",
        "Integration tests and load tests run against the blue staging cluster, never against "
        "the green production cluster.",
    ),
    (
        "team:pnpm",
        "Install JavaScript packages with pnpm, never npm or yarn, and commit pnpm-lock.yaml.",
    ),
    (
        "team:money",
        "Store money amounts as integer cents in a BIGINT column, never as a float column.",
    ),
    (
        "team:pagination",
        "Endpoints that list orders or customers use cursor pagination with next_cursor, "
        "never offset pagination.",
    ),
    (
        "team:idempotency",
        "The charge endpoint for card payments requires an Idempotency-Key header, stored for "
        "24 hours.",
    ),
    (
        "team:tenant",
        "Read the tenant id from the JWT claim, never from the request body or a query parameter.",
    ),
    (
        "team:softdelete",
        "Deleting a customer is a soft delete: set deleted_at; a nightly job purges customers "
        "after 30 days.",
    ),
    (
        "team:temporal",
        "Send emails and other background work from Temporal workflows, never from FastAPI "
        "BackgroundTasks.",
    ),
    (
        "team:reviews",
        "Every pull request needs an approving review from the owning team; Dan owns payments.",
    ),
]

# session -> [(prompt, class, gold ids)]: ten prompts that need a memory and ten that need
# nothing, the fewest the advice takes (relay.eval.advice.MIN_LABELLED)
SESSIONS = {
    "s1": [
        (
            "write a database migration by hand for the new orders table",
            "needs_memory",
            ["team:migrations"],
        ),
        ("ok, do it", "follow_up", []),
        (
            "store the refund amount in cents, which column type for money?",
            "needs_memory",
            ["team:money"],
        ),
        ("continue", "follow_up", []),
        (
            "also edit the database migration for the refund amount column",
            "same_topic",
            ["team:migrations"],
        ),
        ("explain what this regular expression does: ^[a-z]+$", "nothing_relevant", []),
        (
            "add the endpoint that lists a customer's orders with pagination",
            "topic_shift",
            ["team:pagination"],
        ),
        ("go ahead", "follow_up", []),
    ],
    "s2": [
        (
            "which cluster should the integration tests and load tests run against?",
            "needs_memory",
            ["team:staging"],
        ),
        ("run them", "follow_up", []),
        (
            "what is the difference between CMD and ENTRYPOINT in a Dockerfile?",
            "nothing_relevant",
            [],
        ),
        (
            "install the date picker JavaScript package with the package manager",
            "topic_shift",
            ["team:pnpm"],
        ),
        ("sounds good, keep going", "follow_up", []),
        ("add the charge endpoint for card payments", "needs_memory", ["team:idempotency"]),
        (
            "send the order confirmation email once checkout completes",
            "needs_memory",
            ["team:temporal"],
        ),
        ("what does the walrus operator do in Python?", "nothing_relevant", []),
        (
            "who has to approve the pull request for this payments change?",
            "needs_memory",
            ["team:reviews"],
        ),
        ("yes, open it", "follow_up", []),
        (
            "where should the orders endpoint read the tenant id of the caller from?",
            "needs_memory",
            ["team:tenant"],
        ),
        ("thanks, carry on", "follow_up", []),
        (
            "implement deleting a customer account from the admin panel",
            "topic_shift",
            ["team:softdelete"],
        ),
    ],
}


def write_team_dataset(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "memories.jsonl").open("w") as fh:
        for mid, text in MEMORIES:
            fh.write(json.dumps({"store": "acme", "id": mid, "text": text, "meta": {}}) + "\n")
    with (folder / "queries.jsonl").open("w") as fh:
        for session, turns in SESSIONS.items():
            for i, (prompt, kind, gold) in enumerate(turns, 1):
                row = {
                    "store": "acme",
                    "qid": f"{session}:{i}",
                    "query": prompt,
                    "relevant": gold,
                    "answerable": bool(gold),
                    "kind": kind,
                    "meta": {"session": session, "turn": i},
                }
                fh.write(json.dumps(row) + "\n")
    return folder


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit, non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        chunk = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = chunk
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and interlace == 0 and colour in (2, 6), (depth, colour, interlace)
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, previous = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = previous[i]
            c = previous[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        previous = line
    return width, height, rows
