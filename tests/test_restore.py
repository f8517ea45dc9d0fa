"""`relay restore`: a `relay export` file written back, against real servers."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from integration_support import (
    RELAY,
    BatchProxy,
    clean_env,
    mint,
    relay,
    remember,
    revoke,
    start_module_server,
    stop_server,
)

from relay.errors import InvalidRequestError, SecretDetectedError
from relay.models import iso
from relay.restore import (
    RESTORED_FIELDS,
    ExportedMemory,
    check_memories,
    export_begin,
    export_end,
    export_line,
    read_export,
    write_order,
)

# --- reading an export (no server) ---------------------------------------------------------


def fields_of(memory_id: str, **fields) -> dict:
    """What an export line carries that a restore writes, as relay export writes it."""
    return {
        "id": memory_id,
        "title": None,
        "body": f"Fact {memory_id}.",
        "source": None,
        "audiences": ["all"],
        "tags": [],
        "valid_until": None,
        "supersedes": [],
        "pinned": False,
        **fields,
    }


def line(memory_id: str, **fields) -> str:
    return json.dumps(fields_of(memory_id, **fields))


def sealed(lines: Iterable[str]) -> str:
    """`lines` as relay export writes them: between its begin and end lines."""
    lines = list(lines)
    return "".join([export_begin(), *(f"{x}\n" for x in lines), export_end(len(lines))])


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ('{"id": "m2", "body": "x", "audiences": ["all"]', "not JSON (Expecting ',' delimiter)"),
        ('["m2"]', "not a memory from relay export: a JSON object is expected"),
        ('{"id": "m2", "body": "x"}', "not a memory from relay export: it has no 'audiences'"),
        (
            '{"id": "m2", "body": "x", "audiences": ["all"]}',
            "not a memory from relay export: it lacks 'title', 'source', 'tags', 'valid_until',",
        ),
        (line("m2", audiences=[]), "'audiences' is empty (an export names at least 'all')"),
        (line("m2", tags="a,b"), "'tags' is not a list of strings"),
        (line("m2", pinned="yes"), "'pinned' is not true or false"),
        (line("m1"), "memory 'm1' is already on line 1"),
    ],
)
def test_a_malformed_line_is_named_by_file_and_line(bad, message):
    text = "\n".join([line("m1"), bad, line("m3")]) + "\n"
    with pytest.raises(InvalidRequestError) as refused:
        read_export(text, "backup.jsonl")
    assert refused.value.message.startswith("backup.jsonl:2: ")
    assert message in refused.value.message
    assert "\n" not in refused.value.message


def test_only_what_a_write_carries_is_read():
    exported = {
        "id": "m1",
        "revision": 4,
        "title": "T",
        "body": "B",
        "source": "s",
        "audiences": ["all"],
        "tags": ["t"],
        "author": "k1",
        "created_at": "2026-01-01T00:00:00Z",
        "updated_at": "2026-01-02T00:00:00Z",
        "valid_until": None,
        "supersedes": [],
        "superseded_by": "m0",
        "pinned": True,
    }
    (memory,) = read_export("\n" + json.dumps(exported) + "\n\n", "f").memories
    assert memory.line == 2
    assert memory.fields == {k: exported[k] for k in RESTORED_FIELDS}


# Characters str.splitlines() (and other readers) take as a line break, held raw in a string.
BREAKS = "non\u00a0breaking\u2028line\u2029paragraph\x85next\x1crecord\x0bvtab"


def test_a_string_may_hold_what_other_readers_take_for_a_line_break():
    """QA: an export of a memory holding U+2028 could not be restored ("not JSON
    (Unterminated string)"): the file was cut at every character splitlines() breaks at."""
    raw = json.dumps(fields_of("m1", body=BREAKS), ensure_ascii=False)
    text = raw + "\r\n" + line("m2") + "\n"  # one line ends as on Windows
    assert [(m.line, m.fields["body"]) for m in read_export(text, "f").memories] == [
        (1, BREAKS),
        (2, "Fact m2."),
    ]


def test_an_export_line_escapes_those_breaks_and_reads_back_the_same():
    exported = export_line(fields_of("m1", body=BREAKS, title="é\u2028"))
    assert exported.endswith("}\n") and exported.splitlines(keepends=True) == [exported]
    assert "\\u2028" in exported and "non\u00a0breaking" in exported  # the rest stays UTF-8
    (memory,) = read_export(exported, "f").memories
    assert memory.fields == fields_of("m1", body=BREAKS, title="é\u2028")


def test_a_secret_is_named_by_line_before_anything_is_written():
    token = "gh" + "p_" + "Zy9Xw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa"
    text = line("m1") + "\n" + line("m2", body=f"GITHUB_TOKEN={token}")
    memories = read_export(text, "f").memories
    with pytest.raises(SecretDetectedError, match=r"^f:2: memory looks like it contains a secret"):
        check_memories(memories, "f", datetime.now(UTC))


def test_a_format_character_is_refused_by_line_unless_the_server_holds_it():
    """A source or tag with a bidi override that the memory on the server does not hold is
    refused by line before anything is written, as the server would refuse its batch after
    those before it; one it holds (stored by an older release) passes, as it would there.
    The server is asked only about such a memory."""
    legacy, tag = "ops/\u202efdp.exe", "ops-\u2066x"
    text = line("m1", source="ops/a.md") + "\n" + line("m2", source=legacy, tags=[tag])
    memories = read_export(text, "f").memories
    asked: list[str] = []

    def stored(memory_id: str) -> None:  # the server has no such memory
        asked.append(memory_id)

    with pytest.raises(InvalidRequestError, match=r"^f:2: source contains U\+202E \(") as refused:
        check_memories(memories, "f", datetime.now(UTC), stored)
    assert refused.value.details == {"field": "source", "code_point": "U+202E"}
    with pytest.raises(InvalidRequestError, match=r"^f:2: tag '.*' contains U\+2066 \("):
        check_memories(memories, "f", datetime.now(UTC), lambda _: {"source": legacy, "tags": []})
    check_memories(memories, "f", datetime.now(UTC), lambda _: {"source": legacy, "tags": [tag]})
    assert asked == ["m2"]


@pytest.mark.parametrize(
    "missing", [name for name in RESTORED_FIELDS if name not in ("id", "body", "audiences")]
)
def test_a_line_missing_a_field_is_refused_not_given_a_default(missing):
    """QA: a hand-edited backup line without "pinned" (or "valid_until", "supersedes")
    restored silently with the default, unpinning the memory (or making it never expire)."""
    exported = fields_of("m2")
    del exported[missing]
    with pytest.raises(InvalidRequestError) as refused:
        read_export(sealed([line("m1"), json.dumps(exported)]), "backup.jsonl")
    assert refused.value.message == (
        f"backup.jsonl:3: not a memory from relay export: it lacks {missing!r}, which every"
        " line of an export has (null, [] or false for none): a restore would write a default"
        " in its place"
    )


def test_a_file_cut_short_or_edited_is_refused_unless_asked():
    """QA: an export cut short at a line's end (a partial copy, a disk full) restored as if
    whole. Its begin line has no end line after it, or the end line counts other lines."""
    whole = sealed([line("m1"), line("m2"), line("m3")])
    assert read_export(whole, "f") == read_export(whole, "f", allow_incomplete=True)
    assert read_export(whole, "f").unchecked is None
    assert [m.line for m in read_export(whole, "f").memories] == [2, 3, 4]
    lines = whole.splitlines(keepends=True)
    for cut in range(1, len(lines)):  # at every line's end before the last
        with pytest.raises(InvalidRequestError) as refused:
            read_export("".join(lines[:cut]), "f")
        held = f"{cut - 1} {'memory' if cut == 2 else 'memories'}"
        assert refused.value.message == (
            f"f was cut short: it ends after {held} without the end line relay export writes"
            " last (a partial copy, or a disk full while exporting); nothing was restored"
            f" (--allow-incomplete restores the {held} it holds)"
        )
        asked = read_export("".join(lines[:cut]), "f", allow_incomplete=True)
        assert len(asked.memories) == cut - 1
        assert asked.unchecked.endswith(f"; restoring the {held} it holds, as asked")
    edited = "".join(lines[:2] + lines[3:])  # m2 taken out by hand
    with pytest.raises(InvalidRequestError, match=r"^f:4: relay export wrote 3 memories before"):
        read_export(edited, "f")
    twice = "".join(lines[:3]) + sealed([line("m4")])  # one cut short, another after it
    with pytest.raises(InvalidRequestError, match=r"^f:4: a new export begins before the one"):
        read_export(twice, "f")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (line("m1") + "\n", "f has no begin and end lines (an export by an older release)"),
        ("", "f is empty: an older release's export of no memory, or a file cut short"),
        (line("m0") + "\n" + sealed([line("m1")]), "1 memory of f lies outside its export's"),
    ],
)
def test_what_an_older_release_wrote_is_read_with_a_word_that_it_is_unchecked(text, says):
    assert read_export(text, "f").unchecked.startswith(says)


@pytest.mark.parametrize(
    ("mark", "message"),
    [
        ({"relay_export": "begin"}, "its begin line has no format number"),
        ({"relay_export": "begin", "format": 3}, "it is in export format 3, newer than"),
        ({"relay_export": "end", "memories": -1}, "its end line has no count of memories"),
        ({"relay_export": "middle"}, "relay_export is 'middle', not 'begin' or 'end'"),
    ],
)
def test_a_malformed_begin_or_end_line_is_named(mark, message):
    with pytest.raises(InvalidRequestError) as refused:
        read_export(line("m1") + "\n" + json.dumps(mark) + "\n", "f")
    assert refused.value.message.startswith(f"f:2: {message}")


def memories(*supersedes: tuple[str, list[str]]) -> list[ExportedMemory]:
    return [
        ExportedMemory(i, {"id": mid, "body": mid, "audiences": ["all"], "supersedes": targets})
        for i, (mid, targets) in enumerate(supersedes, start=1)
    ]


def test_write_order_puts_what_is_superseded_first_and_keeps_file_order_otherwise():
    order, deferred = write_order(
        memories(("a", ["b"]), ("b", ["c"]), ("x", []), ("c", []), ("d", ["elsewhere"]))
    )
    assert [m.id for m in order] == ["x", "c", "b", "a", "d"]
    assert deferred == set()


def test_write_order_breaks_a_cycle_at_its_earliest_line():
    order, deferred = write_order(memories(("z", ["a"]), ("a", ["b"]), ("b", ["a"])))
    assert [m.id for m in order] == ["a", "z", "b"]
    assert deferred == {("a", "b")}


def test_write_order_defers_only_the_links_that_lead_back():
    """A line in a cycle may also supersede memories outside it: those links need not wait
    (with cycles refused, a link that waits is dropped)."""
    order, deferred = write_order(
        memories(("a", ["b", "c"]), ("b", ["a"]), ("c", ["d"]), ("d", ["c"]))
    )
    assert deferred == {("a", "b"), ("c", "d")}
    assert [m.id for m in order] == ["c", "a", "b", "d"]


# --- round trips against real servers ------------------------------------------------------


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    live = start_module_server(tmp_path_factory, "restore-source")
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    live = start_module_server(tmp_path_factory, "restore-target")
    yield live
    stop_server(live)


def run(server, home: Path, *args: str, key: str | None = None, stdin: str | None = None):
    env = {"RELAY_URL": server.url, "RELAY_API_KEY": key or server.admin_key}
    return relay(home, *args, stdin=stdin, cwd=home, **env)


def get(server, path: str, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key or server.admin_key}"}
    return httpx.get(f"{server.url}{path}", headers=headers, timeout=30)


def listed(server, prefix: str, key: str | None = None) -> dict[str, dict]:
    """Every memory the key may list whose id starts with `prefix`, by id."""
    out, cursor = {}, None
    while True:
        page = get(server, "/v1/memories?limit=500" + (f"&cursor={cursor}" if cursor else ""), key)
        assert page.status_code == 200, page.text
        out.update({m["id"]: m for m in page.json()["items"] if m["id"].startswith(prefix)})
        if not (cursor := page.json()["next_cursor"]):
            return out


def restored_fields(memory: dict) -> dict:
    return {k: memory[k] for k in (*RESTORED_FIELDS, "superseded_by")}


def summary(done) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_export_then_restore_into_a_fresh_server(tmp_path, source, target):
    mint(source.url, source.admin_key, "payments dev", ["memory:write"], ["payments"])
    reader = mint(source.url, source.admin_key, "reader", ["memory:read"])["secret"]
    later = (datetime.now(UTC) + timedelta(days=30)).replace(microsecond=0)
    a = source.admin_key
    remember(source.url, a, id="rt-c-old", body="Staging is the green cluster.", pinned=True)
    remember(
        source.url,
        a,
        id="rt-b-pay",
        body="Payments-only: the Stripe webhook retry window is 72 hours.",
        title="Stripe webhooks",
        source="payments/runbook",
        audiences=["payments"],
        tags=["stripe", "webhooks"],
        valid_until=iso(later),
    )
    # Listed (and exported) before the memory it supersedes: ids are listed in order.
    remember(
        source.url, a, id="rt-a-new", body="Staging is the blue cluster.", supersedes=["rt-c-old"]
    )
    soon = later + timedelta(days=1)
    remember(
        source.url, a, id="rt-d-gone", body="Deploys freeze on Fridays.", valid_until=iso(soon)
    )

    backup = tmp_path / "memories-backup.jsonl"
    assert run(source, tmp_path, "export", "-o", str(backup)).returncode == 0
    begin, *rows, end = map(json.loads, backup.read_text().splitlines())
    assert (begin, end) == (
        {"relay_export": "begin", "format": 2},
        {"relay_export": "end", "memories": len(rows)},
    )
    exported = {m["id"]: m for m in rows}
    assert list(exported)[:4] == ["rt-a-new", "rt-b-pay", "rt-c-old", "rt-d-gone"]
    # The export was taken long ago: one of its memories has expired since.
    backup.write_text(backup.read_text().replace(iso(soon), "2000-01-01T00:00:00Z"))

    # The fresh server has no key with the role yet: the audience is refused, by line.
    refused = run(target, tmp_path, "restore", "memories-backup.jsonl")
    assert refused.returncode == 2
    assert "memories-backup.jsonl:3: unknown audience" in refused.stderr.splitlines()[-1]
    assert listed(target, "rt-") == {}

    mint(target.url, target.admin_key, "payments dev", ["memory:write"], ["payments"])
    target_reader = mint(target.url, target.admin_key, "reader", ["memory:read"])["secret"]
    done = run(target, tmp_path, "restore", "memories-backup.jsonl")
    assert summary(done) == (
        "restored 3 memories: 3 new or changed, 0 unchanged, 1 expired skipped"
    )
    back = listed(target, "rt-")
    assert sorted(back) == ["rt-a-new", "rt-b-pay", "rt-c-old"]
    for memory_id, memory in back.items():
        assert restored_fields(memory) == restored_fields(exported[memory_id]), memory_id
        assert memory["revision"] == 1
    assert back["rt-c-old"]["superseded_by"] == "rt-a-new"

    # Still the payments role's alone.
    for server, key in ((source, reader), (target, target_reader)):
        assert "rt-b-pay" not in listed(server, "rt-", key)
        assert get(server, "/v1/memories/rt-b-pay", key).status_code == 404
        found = httpx.post(
            f"{server.url}/v1/search",
            json={"query": "Stripe webhook retry window refunds", "deadline_ms": 2000},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        ).json()["results"]
        assert all(r["id"] != "rt-b-pay" for r in found)

    # Again, from stdin: nothing changes.
    again = run(target, tmp_path, "restore", "-", stdin=backup.read_text())
    assert summary(again) == "restored 3 memories: 0 new or changed, 3 unchanged, 1 expired skipped"
    assert {k: m["revision"] for k, m in listed(target, "rt-").items()} == dict.fromkeys(back, 1)


def test_restoring_again_after_a_role_s_last_key_is_revoked_changes_nothing(tmp_path, target):
    """QA: once the last key with a role was revoked, restoring an unchanged backup into the
    same server was refused ('unknown audience'): 'restoring the same file again changes
    nothing' broke. Each memory may keep its own audiences; none may gain one."""
    key = mint(target.url, target.admin_key, "retired team", ["memory:read"], ["retired-team"])
    remember(target.url, target.admin_key, id="rv-team", body="Ours.", audiences=["retired-team"])
    remember(target.url, target.admin_key, id="rv-all", body="Everyone's.")
    assert run(target, tmp_path, "export", "-o", "all.jsonl").returncode == 0
    lines = (tmp_path / "all.jsonl").read_text(encoding="utf-8").splitlines()
    backup = tmp_path / "rv.jsonl"
    backup.write_text("".join(f"{x}\n" for x in lines if '"id": "rv-' in x), encoding="utf-8")
    revoke(target.url, target.admin_key, key["id"])

    done = run(target, tmp_path, "restore", "rv.jsonl")
    assert summary(done) == "restored 2 memories: 0 new or changed, 2 unchanged, 0 expired skipped"
    widened = backup.read_text(encoding="utf-8").replace(
        '"audiences": ["all"]', '"audiences": ["retired-team"]'
    )
    (tmp_path / "widened.jsonl").write_text(widened, encoding="utf-8")
    refused = run(target, tmp_path, "restore", "widened.jsonl")
    assert refused.returncode == 2
    assert "widened.jsonl:1: unknown audience: retired-team" in refused.stderr, refused.stderr
    assert listed(target, "rv-")["rv-all"]["audiences"] == ["all"]


def test_a_format_character_an_older_release_stored_restores_only_where_it_is_held(
    tmp_path, source, target
):
    """QA: a memory whose source took a bidi override before such characters were refused
    (an older release) could not be edited, nor its backup restored into its own server:
    every write judged every field again. Restored there, it changes nothing; into another
    server, where the memory would take it anew, it is refused by line before anything is
    written, as a create of it is."""
    legacy = "bidi-restore/\u202efdp.exe"
    remember(source.url, source.admin_key, id="bidi-a", body="Plain.", source="bidi-restore/a")
    remember(source.url, source.admin_key, id="bidi-b", body="Freeze at noon.", tags=["ops"])
    with sqlite3.connect(source.db) as conn:  # beneath the API, as an older release left it
        conn.execute("UPDATE memories SET source = ? WHERE id = 'bidi-b'", (legacy,))
    conn.close()
    assert run(source, tmp_path, "export", "-o", "all.jsonl").returncode == 0
    lines = (tmp_path / "all.jsonl").read_text(encoding="utf-8").splitlines()
    backup = "".join(f"{x}\n" for x in lines if '"id": "bidi-' in x)
    (tmp_path / "bidi.jsonl").write_text(backup, encoding="utf-8")

    done = run(source, tmp_path, "restore", "bidi.jsonl")
    assert summary(done) == "restored 2 memories: 0 new or changed, 2 unchanged, 0 expired skipped"
    assert listed(source, "bidi-")["bidi-b"]["source"] == legacy
    refused = run(target, tmp_path, "restore", "bidi.jsonl")
    assert refused.returncode == 2
    assert "bidi.jsonl:2: source contains U+202E (" in refused.stderr.splitlines()[-1]
    assert listed(target, "bidi-") == {}


def exported_line(memory_id: str, **fields) -> str:
    return json.dumps(
        {
            "id": memory_id,
            "revision": 1,
            "title": None,
            "body": f"Rule {memory_id} of the long list.",
            "source": "bulk/rules",
            "audiences": ["all"],
            "tags": [],
            "author": "k",
            "created_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z",
            "valid_until": None,
            "supersedes": [],
            "superseded_by": None,
            "pinned": False,
            **fields,
        }
    )


def test_more_than_a_batch_with_supersedes_across_batches(tmp_path, target):
    # Each memory supersedes the next one in the file: the last line must be written first.
    ids = [f"bulk-{i:03d}" for i in range(300)]
    text = "\n".join(
        exported_line(mid, supersedes=[ids[i + 1]] if i + 1 < len(ids) else [])
        for i, mid in enumerate(ids)
    )
    (tmp_path / "bulk.jsonl").write_text(text + "\n")
    done = run(target, tmp_path, "restore", "bulk.jsonl")
    assert (
        summary(done) == "restored 300 memories: 300 new or changed, 0 unchanged, 0 expired skipped"
    )
    back = listed(target, "bulk-")
    assert [back[mid]["supersedes"] for mid in ids[:2]] == [[ids[1]], [ids[2]]]
    assert [back[mid]["superseded_by"] for mid in ids[-2:]] == [ids[-3], ids[-2]]
    assert back[ids[0]]["superseded_by"] is None
    again = run(target, tmp_path, "restore", "bulk.jsonl")
    assert (
        summary(again)
        == "restored 300 memories: 0 new or changed, 300 unchanged, 0 expired skipped"
    )


@pytest.mark.parametrize("stop", ["interrupt", "terminate"])
def test_ctrl_c_says_how_far_the_restore_got(tmp_path, target, stop):
    """QA: a Ctrl-C'd `relay restore` printed only 'aborted', where import says how far it
    got; the batch on its way when Ctrl-C came may be written all the same. QA (ops): SIGTERM
    ended it without a word."""
    lines = (exported_line(f"intr-{stop}-{i:03d}") for i in range(300))
    (tmp_path / "intr.jsonl").write_text(sealed(lines))
    with BatchProxy(target.url, nth=2, act=stop) as proxy:
        env = clean_env(tmp_path, RELAY_URL=proxy.url, RELAY_API_KEY=target.admin_key)
        code, out, err = proxy.run(["restore", "intr.jsonl"], env, tmp_path)
    assert (code, out) == (1, ""), err
    assert err == (
        "relay: interrupted with 128 of the file's 300 memories restored (128 new or changed,"
        " 0 unchanged) and 172 not restored yet (128 of them sent, which the server may still"
        " write); running the same restore again finishes it\n"
    )
    assert len(listed(target, f"intr-{stop}-")) == 128
    again = run(target, tmp_path, "restore", "intr.jsonl")
    assert (
        summary(again)
        == "restored 300 memories: 172 new or changed, 128 unchanged, 0 expired skipped"
    )


def test_an_export_cut_short_is_refused_before_anything_is_written(tmp_path, source, target):
    """QA: `head -n 3000 backup.jsonl > copy.jsonl` (or a disk full during `relay export >
    backup.jsonl`) restored 2,999 memories as if that were all. The export's end line is
    missing: the restore stops before writing anything, unless asked. An older release's
    export, which has no such lines, restores with a warning."""
    for i in range(5):
        remember(source.url, source.admin_key, id=f"cut-{i}", body=f"Cut-short fact {i}.")
    assert run(source, tmp_path, "export", "-o", "all.jsonl").returncode == 0
    lines = (tmp_path / "all.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    assert json.loads(lines[0]) == {"relay_export": "begin", "format": 2}
    assert json.loads(lines[-1]) == {"relay_export": "end", "memories": len(lines) - 2}
    mine = [x for x in lines if '"id": "cut-' in x]
    (tmp_path / "cut.jsonl").write_text(lines[0] + "".join(mine[:3]), encoding="utf-8")

    done = run(target, tmp_path, "restore", "cut.jsonl")
    assert (done.returncode, done.stdout, done.stderr) == (
        2,
        "",
        "relay: error: cut.jsonl was cut short: it ends after 3 memories without the end line"
        " relay export writes last (a partial copy, or a disk full while exporting); nothing"
        " was restored (--allow-incomplete restores the 3 memories it holds)\n",
    )
    assert listed(target, "cut-") == {}
    asked = run(target, tmp_path, "restore", "--allow-incomplete", "cut.jsonl")
    assert summary(asked) == "restored 3 memories: 3 new or changed, 0 unchanged, 0 expired skipped"
    assert asked.stderr.startswith("relay: warning: cut.jsonl was cut short: it ends after 3")
    assert sorted(listed(target, "cut-")) == ["cut-0", "cut-1", "cut-2"]

    (tmp_path / "old.jsonl").write_text("".join(mine), encoding="utf-8")  # no begin or end
    old = run(target, tmp_path, "restore", "old.jsonl")
    assert summary(old) == "restored 5 memories: 2 new or changed, 3 unchanged, 0 expired skipped"
    assert old.stderr == (
        "relay: warning: old.jsonl has no begin and end lines (an export by an older release):"
        " whether it is whole, not cut short, cannot be checked\n"
    )


def test_a_hand_edited_line_missing_a_field_stops_the_restore_before_anything_is_written(
    tmp_path, target
):
    """QA: a backup edited by hand, its pinned memory's line without "pinned" (and another's
    without "valid_until"), restored as "1 new or changed": the memory lost its pin without
    a word. The line and the field are named, and nothing is written."""
    later = iso((datetime.now(UTC) + timedelta(days=30)).replace(microsecond=0))
    remember(target.url, target.admin_key, id="hand-pin", body="Pinned by hand.", pinned=True)
    remember(target.url, target.admin_key, id="hand-end", body="Ends.", valid_until=later)
    pinned, ending = (fields_of(f"hand-{x}") for x in ("pin", "end"))
    pinned["body"], ending["body"] = "Pinned by hand.", "Ends."
    del pinned["pinned"], ending["valid_until"]
    (tmp_path / "hand.jsonl").write_text(
        sealed([line("hand-new"), json.dumps(ending), json.dumps(pinned)])
    )
    done = run(target, tmp_path, "restore", "hand.jsonl")
    assert (done.returncode, done.stdout, done.stderr) == (
        2,
        "",
        "relay: error: hand.jsonl:3: not a memory from relay export: it lacks 'valid_until',"
        " which every line of an export has (null, [] or false for none): a restore would"
        " write a default in its place\n",
    )
    assert sorted(listed(target, "hand-")) == ["hand-end", "hand-pin"]  # hand-new not written
    assert get(target, "/v1/memories/hand-pin").json()["pinned"] is True
    assert get(target, "/v1/memories/hand-end").json()["valid_until"] == later


def test_a_batch_failing_midway_says_plainly_how_far_the_restore_got(tmp_path, target):
    """A new user's pass: "server busy; before it, 128 of 301 memories restored (128 new or
    changed, 0 unchanged, 1 expired skipped)" left them asking before what, whether the
    expired one was among the 128 (it was among the 301), what became of the rest, and what
    to do. The counts add up to the file's, and the way to finish is said."""
    gone = "2000-01-01T00:00:00Z"
    lines = [exported_line(f"mid-{i:03d}") for i in range(300)]
    (tmp_path / "mid.jsonl").write_text(sealed([*lines, exported_line("mid-x", valid_until=gone)]))
    with BatchProxy(target.url, nth=2, act="overloaded") as proxy:
        env = clean_env(tmp_path, RELAY_URL=proxy.url, RELAY_API_KEY=target.admin_key)
        code, out, err = proxy.run(["restore", "mid.jsonl"], env, tmp_path)
    assert (code, out) == (6, ""), err
    assert err == (
        "relay: error: server busy; the restore stopped there, with 128 of the file's 301"
        " memories restored (128 new or changed, 0 unchanged), 1 expired skipped and 172 not"
        " restored yet; once that is dealt with, running the same restore again finishes it\n"
    )
    assert len(listed(target, "mid-")) == 128
    again = run(target, tmp_path, "restore", "mid.jsonl")
    assert summary(again) == (
        "restored 300 memories: 172 new or changed, 128 unchanged, 1 expired skipped"
    )


def test_a_malformed_line_stops_the_restore_before_anything_is_written(tmp_path, target):
    good = [exported_line(f"bad-{i}") for i in range(3)]
    (tmp_path / "broken.jsonl").write_text("\n".join([good[0], good[1][:-1], good[2]]) + "\n")
    done = run(target, tmp_path, "restore", "broken.jsonl")
    assert done.returncode == 2
    assert done.stderr == (
        "relay: error: broken.jsonl:2: not JSON (Expecting ',' delimiter); a relay export file"
        " has one memory a line\n"
    )
    assert listed(target, "bad-") == {}


def test_a_supersedes_cycle_loses_the_link_that_closes_it_and_restoring_again_changes_nothing(
    tmp_path, target
):
    """An export from before cycles were refused may hold one: the restore drops the link
    that would close it and counts it, instead of failing (or writing a cycle that recall
    would show nothing of)."""
    text = "\n".join(
        [
            exported_line("cyc-0"),
            exported_line("cyc-a", supersedes=["cyc-b", "cyc-0"]),
            exported_line("cyc-b", supersedes=["cyc-a"]),
        ]
    )
    (tmp_path / "cycle.jsonl").write_text(text + "\n")
    done = run(target, tmp_path, "restore", "cycle.jsonl")
    dropped = ", 1 supersedes link(s) that would close a cycle dropped"
    assert summary(done) == (
        f"restored 3 memories: 3 new or changed, 0 unchanged, 0 expired skipped{dropped}"
    )
    back = listed(target, "cyc-")
    assert [back[m]["supersedes"] for m in ("cyc-a", "cyc-b")] == [["cyc-0"], ["cyc-a"]]
    assert back["cyc-b"]["superseded_by"] is None  # recall shows it
    revisions = {mid: m["revision"] for mid, m in back.items()}
    again = run(target, tmp_path, "restore", "cycle.jsonl")
    assert summary(again) == (
        f"restored 3 memories: 0 new or changed, 3 unchanged, 0 expired skipped{dropped}"
    )
    assert {mid: m["revision"] for mid, m in listed(target, "cyc-").items()} == revisions


def test_a_cycle_the_server_holds_a_link_of_keeps_that_link(tmp_path, target):
    """Where the server already holds one link of the file's cycle, it refuses the other
    (naming it in `closes_cycle`): that one is dropped and the batch sent again, so
    restoring changes nothing."""
    a = target.admin_key
    same = {"source": "bulk/rules"}  # as `exported_line` writes them
    x = remember(target.url, a, id="cyc2-x", body="Rule cyc2-x of the long list.", **same)
    y = remember(
        target.url,
        a,
        id="cyc2-y",
        body="Rule cyc2-y of the long list.",
        supersedes=["cyc2-x"],
        **same,
    )
    text = "\n".join(
        [
            exported_line("cyc2-x", supersedes=["cyc2-y"]),
            exported_line("cyc2-y", supersedes=["cyc2-x"]),
        ]
    )
    (tmp_path / "cycle2.jsonl").write_text(text + "\n")
    done = run(target, tmp_path, "restore", "cycle2.jsonl")
    assert summary(done) == (
        "restored 2 memories: 0 new or changed, 2 unchanged, 0 expired skipped,"
        " 1 supersedes link(s) that would close a cycle dropped"
    )
    back = listed(target, "cyc2-")
    assert [(back[m]["revision"], back[m]["supersedes"]) for m in ("cyc2-x", "cyc2-y")] == [
        (x["revision"], []),
        (y["revision"], ["cyc2-x"]),
    ]


def test_links_to_memories_not_in_the_file(tmp_path, source, target):
    """A link the server already holds is kept, to a memory deleted since or to one this
    key cannot read (dropping it would bring that memory back), so restoring into the
    server the file came from changes nothing; elsewhere a link to a memory that is not
    there is dropped and counted."""
    mint(source.url, source.admin_key, "ops", ["memory:write"], ["ops"])
    dev = mint(source.url, source.admin_key, "dev", ["memory:read", "memory:write"])["secret"]
    a = source.admin_key
    remember(source.url, a, id="ln-old-ops", body="Page ops by phone.", audiences=["ops"])
    remember(source.url, a, id="ln-new", body="Page ops in the app.", supersedes=["ln-old-ops"])
    remember(source.url, a, id="ln-gone", body="Rotate the pager weekly.")
    remember(source.url, a, id="ln-newer", body="Rotate the pager daily.", supersedes=["ln-gone"])
    assert (
        httpx.delete(
            f"{source.url}/v1/memories/ln-gone",
            headers={"Authorization": f"Bearer {a}"},
            timeout=30,
        ).status_code
        == 204
    )

    # The dev key cannot read ln-old-ops: its export holds ln-new without the memory it supersedes.
    assert run(source, tmp_path, "export", "-o", "dev.jsonl", key=dev).returncode == 0
    exported = read_export((tmp_path / "dev.jsonl").read_text(), "dev.jsonl").memories
    exported = [m.fields for m in exported]
    assert {m["id"] for m in exported if m["id"].startswith("ln-")} == {"ln-new", "ln-newer"}
    (tmp_path / "new.jsonl").write_text(
        "\n".join(json.dumps(m) for m in exported if m["id"] == "ln-new") + "\n"
    )
    kept = run(source, tmp_path, "restore", "new.jsonl", key=dev)
    assert summary(kept) == ("restored 1 memory: 0 new or changed, 1 unchanged, 0 expired skipped")
    assert get(source, "/v1/memories/ln-new").json()["supersedes"] == ["ln-old-ops"]

    # The admin's export names ln-old-ops on ln-new: restored by the dev key, the link it
    # cannot read stays on the server, and is not counted as dropped.
    assert run(source, tmp_path, "export", "-o", "all.jsonl").returncode == 0
    (tmp_path / "admin-new.jsonl").write_text(
        "".join(
            line + "\n"
            for line in (tmp_path / "all.jsonl").read_text().splitlines()
            if json.loads(line).get("id") == "ln-new"
        )
    )
    unseen = run(source, tmp_path, "restore", "admin-new.jsonl", key=dev)
    assert summary(unseen) == (
        "restored 1 memory: 0 new or changed, 1 unchanged, 0 expired skipped, 1 supersedes"
        " link(s) to memories this key cannot read left as the server holds them"
    )
    assert get(source, "/v1/memories/ln-new").json()["supersedes"] == ["ln-old-ops"]

    # ln-newer's link to the deleted ln-gone is the only one that cannot come back.
    (tmp_path / "newer.jsonl").write_text(
        "\n".join(json.dumps(m) for m in exported if m["id"] == "ln-newer") + "\n"
    )
    done = run(source, tmp_path, "restore", "newer.jsonl", key=dev)
    assert summary(done) == "restored 1 memory: 0 new or changed, 1 unchanged, 0 expired skipped"
    assert get(source, "/v1/memories/ln-newer").json()["supersedes"] == ["ln-gone"]
    elsewhere = run(target, tmp_path, "restore", "newer.jsonl")
    assert summary(elsewhere) == (
        "restored 1 memory: 1 new or changed, 0 unchanged, 0 expired skipped,"
        " 1 supersedes link(s) to memories not here dropped"
    )
    assert get(target, "/v1/memories/ln-newer").json()["supersedes"] == []


def test_a_memory_deleted_since_is_named_by_its_line(tmp_path, source):
    """Deleted ids are never reused, so a restore cannot bring one back under its id."""
    remember(source.url, source.admin_key, id="del-x", body="Use the old VPN.")
    exported = get(source, "/v1/memories/del-x").json()
    assert (
        httpx.delete(
            f"{source.url}/v1/memories/del-x",
            headers={"Authorization": f"Bearer {source.admin_key}"},
            timeout=30,
        ).status_code
        == 204
    )
    (tmp_path / "old.jsonl").write_text(
        exported_line("del-ok") + "\n" + json.dumps(exported) + "\n"
    )
    done = run(source, tmp_path, "restore", "old.jsonl")
    assert done.returncode == 5
    assert done.stderr.strip().splitlines()[-1] == (
        "relay: error: old.jsonl:2: memory 'del-x' was deleted; its id cannot be reused"
    )
    assert get(source, "/v1/memories/del-ok").status_code == 404


def test_a_link_the_server_refuses_is_named_by_its_line(tmp_path, target):
    """QA: the server refused a batch item for its `supersedes` without naming the item, so
    the restore could not name the line: here a memory for sre alone that would supersede
    one for everyone (and so take it from everyone else)."""
    mint(target.url, target.admin_key, "sre-restore", ["memory:read"], ["sre"])
    text = "\n".join(
        [
            exported_line("nar-wide"),
            exported_line("nar-ok"),
            exported_line("nar-sre", audiences=["sre"], supersedes=["nar-wide"]),
        ]
    )
    (tmp_path / "narrow.jsonl").write_text(text + "\n")
    done = run(target, tmp_path, "restore", "narrow.jsonl")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "relay: error: narrow.jsonl:3: 'nar-wide' reaches all, which this memory would not:"
        " give it those audiences too, or leave it unsuperseded"
    )


def test_a_memory_this_key_cannot_read_is_named_by_its_line(tmp_path, source):
    """Its id is taken, whether that memory lives or was deleted: one answer for both (a
    key without the role was told 'exists' for one and 'was deleted' for the other)."""
    sre = mint(source.url, source.admin_key, "sre", ["memory:write"], ["sre"])["secret"]
    dev = mint(source.url, source.admin_key, "dev2", ["memory:read", "memory:write"])["secret"]
    lines = []
    for memory_id in ("hid-sre", "hid-sre-gone"):
        remember(source.url, sre, id=memory_id, body="Failover by hand.", audiences=["sre"])
        (tmp_path / "sre.jsonl").write_text(
            json.dumps(get(source, f"/v1/memories/{memory_id}").json())
        )
        if memory_id.endswith("-gone"):
            gone = httpx.delete(
                f"{source.url}/v1/memories/{memory_id}",
                headers={"Authorization": f"Bearer {sre}"},
                timeout=30,
            )
            assert gone.status_code == 204
        done = run(source, tmp_path, "restore", "sre.jsonl", key=dev)
        assert done.returncode == 5
        lines.append(done.stderr.strip().splitlines()[-1].replace(memory_id, "ID"))
    assert (
        lines
        == [
            "relay: error: sre.jsonl:1: id 'ID' is taken by a memory for audiences this key lacks"
            " (a deleted memory's id stays taken too)"
        ]
        * 2
    )


def test_long_memories_travel_in_requests_the_server_accepts(tmp_path, target):
    accented = "Déjà vérifié à l'étape précédente: côté serveur, réécrire l'entrée. " * 60
    text = "\n".join(exported_line(f"long-{i:02d}", body=accented) for i in range(40))
    assert len(text) > 256 * 1024  # escaped to ASCII, as the client sends it
    (tmp_path / "long.jsonl").write_text(text + "\n")
    done = run(target, tmp_path, "restore", "long.jsonl")
    assert (
        summary(done) == "restored 40 memories: 40 new or changed, 0 unchanged, 0 expired skipped"
    )


def test_an_export_that_fails_midway_leaves_the_earlier_backup_as_it_was(tmp_path: Path):
    """QA: `relay export -o backup.jsonl` wrote the file page by page, so a server failing on
    the third page left the old 4,169-line backup cut to 1,000 lines, every one valid, and
    `relay restore` took it for complete."""
    from hook_support import FakeRelay, reply

    first = {"items": [json.loads(line("m1"))], "next_cursor": "c2"}
    down = {"error": {"code": "unavailable", "message": "db down", "status": 503}}

    def pages(conn, request):  # noqa: ANN001, ANN202
        return (
            reply(200, first)(conn, request)
            if "cursor" not in request.path
            else (reply(503, down)(conn, request))
        )

    backup = tmp_path / "backup.jsonl"
    backup.write_text(line("old") + "\n", encoding="utf-8")
    with FakeRelay(pages) as server:
        env = {"RELAY_URL": server.url, "RELAY_API_KEY": "relay_k_s"}
        done = relay(tmp_path, "export", "-o", str(backup), **env)
    assert done.returncode != 0 and "db down" in done.stderr
    assert backup.read_text(encoding="utf-8") == line("old") + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup.jsonl"]  # no partial left


def test_a_memory_holding_line_separators_survives_export_and_restore(tmp_path: Path, target):
    """QA: `relay remember` of a body holding U+2028, then export and restore: the restore
    stopped at that line, so the backup could not be restored at all."""
    body = "non\u00a0breaking\u2028line\u2029paragraph"  # a body holds no control character
    remember(target.url, target.admin_key, id="sep-1", body=body)
    assert run(target, tmp_path, "export", "-o", "all.jsonl").returncode == 0
    text = (tmp_path / "all.jsonl").read_text(encoding="utf-8")
    assert "\u2028" not in text and text.count("\n") == len(text.splitlines())
    done = run(target, tmp_path, "restore", "all.jsonl")
    assert done.returncode == 0, done.stderr
    back = get(target, "/v1/memories/sep-1").json()
    assert (back["body"], back["revision"]) == (body, 1)


def test_an_export_file_is_its_owners_alone(tmp_path: Path, source):
    """It holds every memory the key may read, role-restricted ones too."""
    done = run(source, tmp_path, "export", "-o", "all.jsonl")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "all.jsonl").stat().st_mode & 0o777 == 0o600


def test_an_export_writes_through_a_symlink_and_keeps_it(tmp_path: Path, source):
    """QA: `-o link` replaced the symlink with a file instead of writing the file it names,
    and a symlink to another file system ended in a traceback (EXDEV: the partial file was
    made beside the target, renamed over the link)."""
    remember(source.url, source.admin_key, id="link-1", body="Exports follow symlinks.")
    (tmp_path / "backups").mkdir()
    places = [tmp_path / "backups" / "all.jsonl"]
    shm = Path("/dev/shm")
    if shm.is_dir() and shm.stat().st_dev != tmp_path.stat().st_dev:
        places.append(shm / f"relay-export-{os.getpid()}.jsonl")  # another file system
    try:
        for place in places:
            place.write_text("old backup\n", encoding="utf-8")
            link = tmp_path / "latest.jsonl"
            link.unlink(missing_ok=True)
            link.symlink_to(place)
            done = run(source, tmp_path, "export", "-o", "latest.jsonl")
            assert done.returncode == 0 and done.stderr == "", done.stderr
            assert link.is_symlink() and link.resolve() == place, place
            exported = read_export(place.read_text(encoding="utf-8"), str(place)).memories
            assert "link-1" in {m.id for m in exported}, place
            assert not list(place.parent.glob(f".{place.name}.*"))  # no partial left
        dangling = tmp_path / "next.jsonl"
        dangling.symlink_to(tmp_path / "backups" / "next.jsonl")
        assert run(source, tmp_path, "export", "-o", "next.jsonl").returncode == 0
        assert dangling.is_symlink() and (tmp_path / "backups" / "next.jsonl").stat().st_size
    finally:
        for place in places[1:]:
            place.unlink(missing_ok=True)


def test_an_export_to_what_is_not_a_file_is_written_to_directly(tmp_path: Path, source):
    """QA: `-o FIFO` turned the FIFO into a regular file (its reader got nothing and
    waited), `-o /dev/null` did the same to /dev/null as root, and `-o /dev/stdout` said
    'No such file or directory'."""
    import threading

    remember(source.url, source.admin_key, id="fifo-1", body="Exports reach a pipe's reader.")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str] = []
    # A daemon: were the FIFO replaced, its reader would wait for ever.
    reader = threading.Thread(
        target=lambda: got.append(fifo.read_text(encoding="utf-8")), daemon=True
    )
    reader.start()
    done = run(source, tmp_path, "export", "-o", str(fifo))
    reader.join(timeout=30)
    assert done.returncode == 0, done.stderr
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert "fifo-1" in {m.id for m in read_export(got[0], "pipe").memories}

    to_stdout = run(source, tmp_path, "export", "-o", "/dev/stdout")
    assert to_stdout.returncode == 0, to_stdout.stderr
    assert "fifo-1" in {m.id for m in read_export(to_stdout.stdout, "stdout").memories}

    # /dev/stdout opened for appending (`>> log`): appended to, not replaced.
    log = tmp_path / "log.jsonl"
    log.write_text(line("earlier") + "\n", encoding="utf-8")
    env = clean_env(tmp_path, RELAY_URL=source.url, RELAY_API_KEY=source.admin_key)
    with log.open("a", encoding="utf-8") as out:
        appended = subprocess.run(
            [RELAY, "export", "-o", "/dev/stdout"], env=env, stdout=out, stderr=subprocess.PIPE
        )
    assert appended.returncode == 0, appended.stderr
    ids = [m.id for m in read_export(log.read_text(encoding="utf-8"), "log").memories]
    assert ids[0] == "earlier" and "fifo-1" in ids


def test_an_export_that_cannot_be_written_says_so_in_one_line(tmp_path: Path, source):
    for output, says in (
        (tmp_path / "missing" / "all.jsonl", "No such file or directory"),
        (tmp_path / "loop.jsonl", "Too many levels of symbolic links"),
    ):
        if output.name == "loop.jsonl":
            output.symlink_to(output)
        done = run(source, tmp_path, "export", "-o", str(output))
        assert done.returncode != 0
        assert done.stderr == f"relay: error: cannot write {output}: {says}\n", done.stderr


def test_a_piped_restore_draws_no_progress_line(tmp_path: Path, target):
    """A new user's pass: without a terminal the bar was one lone 'restoring' on stderr,
    run into the next output line. (Back into the server it came from: every audience is
    known there, whatever the module's other tests wrote.)"""
    remember(target.url, target.admin_key, body="Piped restores draw no bar.")
    assert run(target, tmp_path, "export", "-o", "all.jsonl").returncode == 0
    done = run(target, tmp_path, "restore", "all.jsonl")
    assert done.returncode == 0 and done.stderr == "", done.stderr
