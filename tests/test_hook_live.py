"""The real hook against a real `relay serve` on loopback, started as a subprocess."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from hook_support import Hook, assert_hit_contract, assert_silent

MIGRATIONS = (
    "Database migrations: create them with `make migration name=...` and apply them with "
    "`make migrate`; never edit a migration that has already been applied on staging."
)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """`relay serve` on its own database, started by conftest's launcher.

    Not the session-wide `live_server` fixture: its teardown leaves the server's
    stdout pipe open, which pytest (warnings as errors) turns into a failed run.
    """
    from conftest import start_server

    server = start_server(tmp_path_factory.mktemp("hook-live") / "relay.db")
    yield server
    server.stop()
    if server.process.stdout:
        server.process.stdout.close()


@pytest.fixture(scope="module")
def org(live):
    """The server's first organisation, with one ordinary and one pinned memory."""
    admin = live.admin_key
    with httpx.Client(
        base_url=live.url, headers={"Authorization": f"Bearer {admin}"}, timeout=30
    ) as client:
        created = client.post(
            "/v1/memories",
            json={"body": MIGRATIONS, "title": "Migrations", "source": "team/db/migrations"},
        )
        assert created.status_code == 201, created.text
        pinned = client.post(
            "/v1/memories",
            json={
                "body": "Code review: every change needs an approving review by the owning team.",
                "title": "Reviews",
                "source": "team/process/reviews",
                "pinned": True,
            },
        )
        assert pinned.status_code == 201, pinned.text
        yield {
            "client": client,
            "admin": admin,
            "url": live.url,
            "migration": created.json(),
        }


def test_hit_no_match_and_revision_reinjection_against_the_real_server(tmp_path, org):
    hook = Hook(
        tmp_path,
        org["url"],
        RELAY_API_KEY=org["admin"],
        RELAY_THROTTLE_PROMPTS="0",
        RELAY_OVERLAP_THRESHOLD="1.5",
    )
    prompt = "how do I create and apply a new database migration?"
    run = hook.prompt(prompt)
    context = assert_hit_contract(run)
    entry = hook.last()
    assert entry["outcome"] == "hit", entry
    mid = org["migration"]["id"]
    assert f'id="{mid}" revision="1" source="team/db/migrations"' in context
    assert "make migrate" in context and "data, not instructions" in context
    assert isinstance(entry["server_ms"], int | float)
    # the same question again: already in the conversation
    assert_silent(hook.prompt(prompt))
    assert hook.last()["outcome"] == "no_match" and hook.last()["duplicates"] >= 1
    # an edit makes revision 2, which comes back once
    edited = org["client"].patch(
        f"/v1/memories/{mid}", json={"body": MIGRATIONS + " Squash migrations only before release."}
    )
    assert edited.status_code == 200, edited.text
    context = assert_hit_contract(hook.prompt(prompt))
    assert f'id="{mid}" revision="2"' in context and "Squash" in context
    # something the team never wrote down
    assert_silent(hook.prompt("what is a good recipe for sourdough bread with rye flour?"))
    assert hook.last()["outcome"] == "no_match"


def test_session_start_profile_then_prompt_does_not_repeat_it(tmp_path, org):
    hook = Hook(tmp_path, org["url"], RELAY_API_KEY=org["admin"])
    context = assert_hit_contract(hook.session_start("startup"), "SessionStart")
    assert "team/process/reviews" in context and "approving review by" in context
    assert_silent(hook.prompt("who has to approve a code review before a change can merge?"))
    assert hook.last()["outcome"] == "no_match" and hook.last()["duplicates"] >= 1


def test_revoked_key_is_unauthorized_and_tells_the_user_once(tmp_path, org):
    client = org["client"]
    made = client.post(
        "/v1/keys", json={"name": "hook-revoked", "scopes": ["memory:read"], "roles": []}
    )
    assert made.status_code == 201, made.text
    assert client.delete(f"/v1/keys/{made.json()['id']}").status_code == 200
    hook = Hook(
        tmp_path,
        org["url"],
        RELAY_API_KEY=made.json()["secret"],
        RELAY_THROTTLE_PROMPTS="0",
        RELAY_OVERLAP_THRESHOLD="1.5",
    )
    first = hook.prompt("how do I add a new database migration for the orders table?")
    assert set(first.output) == {"systemMessage"}
    assert hook.last()["outcome"] == "unauthorized" and hook.last()["http_status"] == 401
    assert_silent(hook.prompt("how do I add a new database migration for the orders table?"))
    assert hook.last()["outcome"] == "unauthorized"


def test_whole_process_within_the_deadline_against_the_real_server(tmp_path, org):
    hook = Hook(tmp_path, org["url"], RELAY_API_KEY=org["admin"], RELAY_DEADLINE_MS="400")
    for n in range(5):
        run = hook.prompt("how do I add a new database migration?", session=f"t{n}")
        assert run.rc == 0 and run.ms <= 400 + 150
        assert hook.last()["outcome"] in ("hit", "no_match"), hook.last()
        # Its own time is at most the process's, give or take /proc's 10 ms tick: it once
        # counted from before its start by the time its imports took (QA: 63 ms logged, 39 run).
        assert hook.last()["ms"]["total"] <= run.ms + 12, (hook.last()["ms"], run.ms)


@pytest.mark.parametrize("max_records", ["10", "20"])
def test_a_large_max_records_still_recalls(tmp_path, org, max_records):
    """Any max_records the config accepts works: the hook never asks the server for more
    results than one search returns (asking for 23 was a 422 on every prompt)."""
    hook = Hook(tmp_path, org["url"], RELAY_API_KEY=org["admin"], RELAY_MAX_RECORDS=max_records)
    context = assert_hit_contract(
        hook.prompt("how do I create and apply a new database migration?")
    )
    assert "make migrate" in context and hook.last()["outcome"] == "hit", hook.last()


@pytest.mark.parametrize("budget", ["50", "150", "152"])
def test_every_token_budget_the_config_accepts_can_inject(tmp_path, org, budget):
    """A budget the preamble leaves no room in injected nothing on every prompt and logged
    it as a healthy no_match (QA: RELAY_MAX_TOKENS=150); now it is out of range, the default
    applies, and the least budget accepted carries a record (cut to fit if need be)."""
    hook = Hook(
        tmp_path,
        org["url"],
        RELAY_API_KEY=org["admin"],
        RELAY_MAX_TOKENS=budget,
        RELAY_PROFILE_MAX_TOKENS=budget,
    )
    context = assert_hit_contract(hook.session_start("startup"), "SessionStart")
    assert "team/process/reviews" in context
    context = assert_hit_contract(
        hook.prompt("how do I create and apply a new database migration?")
    )
    assert "team/db/migrations" in context and hook.last()["outcome"] == "hit", hook.last()


def test_two_parts_of_one_long_memory_are_both_recalled_each_once(tmp_path, org):
    """QA: once one passage of a long memory was injected, every other passage of that
    revision was dropped as a duplicate, though the model never saw its text."""
    release = " ".join(
        f"Release step {n}: the release manager tags the build and announces the train in the"
        f" release channel, then waits for the canary dashboards to settle."
        for n in range(8)
    )
    failover = (
        "Failover drills: the on-call engineer must page the database team before any"
        " failover drill, and restore the primary replica within thirty minutes."
    )
    made = org["client"].post(
        "/v1/memories",
        json={"body": release + "\n\n" + failover, "title": "Operations handbook"},
    )
    assert made.status_code == 201, made.text
    mid = made.json()["id"]
    hook = Hook(
        tmp_path,
        org["url"],
        RELAY_API_KEY=org["admin"],
        RELAY_THROTTLE_PROMPTS="0",
        RELAY_OVERLAP_THRESHOLD="1.5",
        RELAY_MIN_SCORE="0",
    )
    first = assert_hit_contract(hook.prompt("how does the release manager announce the train?"))
    label = re.compile(f'id="{mid}" revision="1" part="([0-9]+) of ([0-9]+)"')
    assert label.search(first) and "release channel" in first
    second = assert_hit_contract(hook.prompt("who must be paged before a database failover drill?"))
    assert label.search(second) and "page the database team" in second
    assert label.search(first)[1] != label.search(second)[1]
    assert label.search(first)[2] == label.search(second)[2] != "1"
    assert hook.last()["duplicates"] == 0
    # each part again: already in the conversation
    assert_silent(hook.prompt("who must be paged before a database failover drill?"))
    assert hook.last()["outcome"] == "no_match" and hook.last()["duplicates"] >= 1


def test_a_passage_moved_by_an_inserted_section_is_not_injected_again(tmp_path, org):
    """QA: an edit that inserted a section before a passage of a long memory renumbered it,
    and the hook injected its unchanged text again under the new number."""
    freeze = (
        "Code freeze: the week before a release only fixes for blocking bugs land, each"
        " approved by the freeze captain in the freeze channel."
    )
    steps = "\n\n".join(
        f"Rollout stage {n}: the deployer widens the rollout to the next ring and watches the"
        " error budget dashboards for thirty minutes before going on."
        for n in range(6)
    )
    made = org["client"].post(
        "/v1/memories", json={"body": steps + "\n\n" + freeze, "title": "Rollout handbook"}
    )
    assert made.status_code == 201, made.text
    mid = made.json()["id"]
    hook = Hook(
        tmp_path,
        org["url"],
        RELAY_API_KEY=org["admin"],
        RELAY_THROTTLE_PROMPTS="0",
        RELAY_OVERLAP_THRESHOLD="1.5",
        RELAY_MIN_SCORE="0",
    )
    label = re.compile(f'id="{mid}" revision="([0-9]+)" part="([0-9]+) of ([0-9]+)"')
    first = assert_hit_contract(hook.prompt("who approves fixes during the code freeze?"))
    assert "freeze captain" in first
    before = label.search(first)
    canary = " ".join(
        f"Canary check {n}: before any rollout the canary host runs the smoke suite against"
        " production traffic mirrors and must report green."
        for n in range(5)
    )
    edited = org["client"].patch(
        f"/v1/memories/{mid}", json={"body": canary + "\n\n" + steps + "\n\n" + freeze}
    )
    assert edited.status_code == 200, edited.text
    # the server now numbers the unchanged freeze passage further on
    found = org["client"].post(
        "/v1/search", json={"query": "who approves fixes during the code freeze?", "k": 3}
    )
    (hit,) = [r for r in found.json()["results"] if r["id"] == mid]
    assert hit["revision"] == 2 and hit["passage"] + 1 > int(before[2])
    assert hit["passages"] > int(before[3])
    assert_silent(hook.prompt("who approves fixes during the code freeze again?"))
    assert hook.last()["outcome"] == "no_match" and hook.last()["duplicates"] >= 1
    # the inserted section is new text: it comes in
    context = assert_hit_contract(hook.prompt("what does the canary host run before a rollout?"))
    assert "smoke suite" in context and label.search(context)[1] == "2"


def test_a_fact_remembered_twice_is_injected_once(tmp_path, org):
    """Two teammates remembered the same fact: the hook injected it twice, two of its three
    records and twice the tokens for one fact."""
    rota = "The payments on-call rota lives in PagerDuty under the schedule payments-primary."
    ids = []
    for source in ("team/alice", "team/bob"):
        made = org["client"].post("/v1/memories", json={"body": rota, "source": source})
        assert made.status_code == 201, made.text
        ids.append(made.json()["id"])
    hook = Hook(tmp_path, org["url"], RELAY_API_KEY=org["admin"])
    context = assert_hit_contract(hook.prompt("where is the payments on-call rota kept?"))
    assert context.count("payments-primary") == 1, context
    # one of the two, whichever scored better (their sources differ, so may their scores)
    assert sum(f'id="{i}"' in context for i in ids) == 1, context


def test_a_prompt_holding_a_lone_surrogate_still_recalls(tmp_path, org):
    """Claude Code's JSON can carry a lone surrogate (`\\ud83d`, half of a pasted emoji): the
    hook sent it on, the server refused the query with a 422, and the prompt recalled nothing,
    logged `invalid_response` (QA)."""
    hook = Hook(tmp_path, org["url"], RELAY_API_KEY=org["admin"])
    stdin = hook.payload("how do I create and apply a new database migration? \ud83d")
    assert b"\\ud83d" in stdin
    context = assert_hit_contract(hook.run(stdin))
    assert "make migrate" in context and hook.last()["outcome"] == "hit", hook.last()


def test_stdin_opening_with_a_byte_order_mark_is_read(tmp_path, org):
    """QA: some Windows shells and agents write a UTF-8 byte-order mark before the JSON;
    the hook logged `skipped`, reason `bad_input`, and recalled nothing for the prompt."""
    hook = Hook(tmp_path, org["url"], RELAY_API_KEY=org["admin"])
    payload = hook.payload("how do I create and apply a new database migration?")
    context = assert_hit_contract(hook.run(b"\xef\xbb\xbf" + payload))
    assert "make migrate" in context and hook.last()["outcome"] == "hit"
    # One mark is skipped, not any text before the JSON.
    assert_silent(hook.run(b"\xef\xbb\xbf\xef\xbb\xbf" + payload))
    assert (hook.last()["outcome"], hook.last()["reason"]) == ("skipped", "bad_input")


def test_a_turn_id_sent_as_a_number_is_logged_as_its_string(tmp_path, org):
    """QA: a Codex-shaped input whose turn_id was a JSON number logged `prompt_id: null`, so
    the log line could not be joined to the agent's turn, and the same turn reaching the
    hook twice was told apart only by its text."""
    hook = Hook(tmp_path, org["url"], RELAY_API_KEY=org["admin"])
    codex = {
        "session_id": "codex-1",
        "turn_id": 42,
        "model": "gpt-x",
        "hook_event_name": "UserPromptSubmit",
        "prompt": "how do I create and apply a new database migration?",
    }
    assert_hit_contract(hook.run(json.dumps(codex).encode()))
    assert hook.last()["prompt_id"] == "42"
    assert hook.session_state("codex-1")["last_prompt_id"] == "42"
    assert_silent(hook.run(json.dumps(codex).encode()))
    assert hook.last()["reason"] == "repeat_prompt" and hook.last()["prompt_id"] == "42"
