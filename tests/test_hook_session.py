"""A conversation through the real hook: gating, ledger, revisions, SessionStart, concurrency."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest
from click.testing import CliRunner
from hook_support import (
    HOOK,
    FakeRelay,
    Hook,
    assert_hit_contract,
    assert_silent,
    record,
    reply,
    results,
    run_together,
)

from relay.hook_stats import stats


class Knowledge:
    """A fake search: memories whose topic word appears in the query, at their current revision."""

    def __init__(self) -> None:
        self.revisions = {"mem_migrate": 1, "mem_deploy": 1, "mem_logging": 1, "mem_tests": 1}
        self.topics = {
            "migration": "mem_migrate",
            "deploy": "mem_deploy",
            "logging": "mem_logging",
            "test": "mem_tests",
        }

    def __call__(self, conn, request) -> None:
        query = request.json()["query"].lower()
        found = [
            record(rid, self.revisions[rid]) for word, rid in self.topics.items() if word in query
        ]
        reply(200, results(*found))(conn, request)


# (prompt, expected outcome, skip reason or injected ids)
CONVERSATION = [
    ("how do we write a database migration for the orders table?", "hit", ["mem_migrate"]),
    ("continue", "skipped", "short_prompt"),
    ("ok", "skipped", "short_prompt"),
    ("add an index migration for the orders table customer column", "skipped", "same_topic"),
    ("how do we deploy the billing service to staging?", "hit", ["mem_deploy"]),
    ("what about production deploys?", "skipped", "throttled"),
    ("continue", "skipped", "short_prompt"),
    ("which logging conventions does the worker follow?", "hit", ["mem_logging"]),
    ("ok", "skipped", "short_prompt"),
    ("yes please", "skipped", "short_prompt"),
    ("how should the orders migration be covered by a test?", "hit", ["mem_tests"]),
    ("continue", "skipped", "short_prompt"),
    ("thanks, that works", "skipped", "throttled"),
    ("ok", "skipped", "short_prompt"),
    # mem_migrate gets revision 2 on the server before this prompt
    ("now the payments schema needs a migration, same rules?", "hit", ["mem_migrate"]),
    ("continue", "skipped", "short_prompt"),
    ("ok", "skipped", "short_prompt"),
    ("what logging fields must every worker deploy emit?", "no_match", None),
    ("continue", "skipped", "short_prompt"),
    ("please please please please please", "skipped", "no_keywords"),
]


def test_twenty_prompt_session_with_topic_shifts_and_follow_ups(tmp_path):
    knowledge = Knowledge()
    with FakeRelay(knowledge) as server:
        hook = Hook(tmp_path, server.url)
        injected: list[tuple[str, int]] = []
        for n, (prompt, outcome, detail) in enumerate(CONVERSATION, 1):
            if n == 15:
                knowledge.revisions["mem_migrate"] = 2
            run = hook.prompt(prompt, prompt_id=f"p{n}")
            entry = hook.last()
            assert entry["outcome"] == outcome, (n, prompt, entry)
            assert entry["prompt_id"] == f"p{n}"
            if outcome == "hit":
                context = assert_hit_contract(run)
                ids = [rid for rid, _ in entry["injected"]]
                assert ids == detail, (n, entry)
                for rid, rev in entry["injected"]:
                    assert f'id="{rid}" revision="{rev}"' in context
                injected.extend(map(tuple, entry["injected"]))
            else:
                assert_silent(run)
                if outcome == "skipped":
                    assert entry["reason"] == detail, (n, entry)
        searches = [e for e in hook.outcomes() if e["outcome"] in ("hit", "no_match")]
        assert len(server.requests) == len(searches) == 6
    # every (id, revision) at most once; the edited memory came back at its new revision
    assert len(injected) == len(set(injected))
    assert ("mem_migrate", 1) in injected and ("mem_migrate", 2) in injected
    # prompt 18 found records, all already in the conversation
    assert hook.outcomes()[17]["duplicates"] == 2
    state = hook.session_state()
    assert state["count"] == 20
    assert state["ledger"] == {"mem_deploy": 1, "mem_tests": 1, "mem_migrate": 2, "mem_logging": 1}


def test_first_substantive_prompt_always_searches(tmp_path):
    with FakeRelay(reply(200, results())) as server:
        hook = Hook(tmp_path, server.url)
        hook.prompt("ok")
        hook.prompt("continue")
        assert server.requests == []
        assert_silent(hook.prompt("where is the staging database configured?"))
        assert hook.last()["outcome"] == "no_match"
        assert len(server.requests) == 1


def test_an_answer_the_server_ran_out_of_time_for_is_a_timeout_and_leaves_the_topic_open(
    tmp_path,
):
    """QA: the server's answer to a search it had no time for (`stages: [], degraded: true,
    results: []`, what it sends for deadline_ms 1-5 or under load) was logged as a healthy
    no_match and its keywords kept, so a rephrasing of the topic was `same_topic` for the
    rest of the session. A lexical-only degraded answer with results is a hit as before."""
    starved = {"results": [], "stages": [], "degraded": True, "cached": False, "took_ms": 0.2}
    lexical_only = {**results(record("mem_deploy")), "stages": ["lexical"], "degraded": True}
    answers = [starved, lexical_only]
    with FakeRelay(lambda conn, request: reply(200, answers.pop(0))(conn, request)) as server:
        hook = Hook(tmp_path, server.url, RELAY_THROTTLE_PROMPTS="0")
        assert_silent(hook.prompt("how do we deploy the billing service to staging?"))
        entry = hook.last()
        assert (entry["outcome"], entry["reason"]) == ("timeout", "server_out_of_time")
        assert hook.session_state()["keywords"] == []
        run = hook.prompt("how do we deploy the billing service to staging, step by step?")
        assert "mem_deploy" in assert_hit_contract(run)
        assert len(server.requests) == 2
    stats = json.loads(
        subprocess.run(
            [str(HOOK.parent / "relay"), "stats", "--json", "--state-dir", str(hook.state_dir)],
            capture_output=True,
            env=hook.env,
            check=True,
        ).stdout
    )
    assert stats["searched"]["timeout"] == 1 and stats["searched"]["no_match"] == 0
    assert stats["skip_reasons"]["timeout:server_out_of_time"] == 1


def test_search_request_carries_query_k_deadline_and_key(tmp_path):
    with FakeRelay(reply(200, results())) as server:
        # The default 2,000 ms (Hook's): at 400 a hook started late under load sent nothing.
        hook = Hook(tmp_path, server.url, RELAY_MAX_RECORDS="2")
        hook.prompt("  where is the staging database configured?  " + "x" * 5000)
        (req,) = server.requests
    assert req.method == "POST" and req.path == "/v1/search"
    assert req.headers["authorization"] == "Bearer relay_test_0123456789abcdef"
    body = req.json()
    assert set(body) == {"query", "k", "deadline_ms"}
    assert body["query"].startswith("where is the staging database configured?")
    assert len(body["query"]) == 2000
    assert body["k"] == 5
    assert 20 <= body["deadline_ms"] <= 1950  # remaining budget minus the pack reserve


def test_overlap_threshold_and_throttle_knobs(tmp_path):
    with FakeRelay(reply(200, results())) as server:
        hook = Hook(tmp_path, server.url, RELAY_THROTTLE_PROMPTS="0", RELAY_OVERLAP_THRESHOLD="1.5")
        for _ in range(3):
            hook.prompt("where is the staging database configured?")
        assert len(server.requests) == 3
        hook = Hook(tmp_path / "b", server.url, RELAY_THROTTLE_PROMPTS="0")
        hook.prompt("where is the staging database configured?")
        hook.prompt("where is the staging database configured again?")
        assert hook.last()["reason"] == "same_topic"
        hook.prompt("how are feature flags rolled out?")
        assert hook.last()["outcome"] == "no_match"


def test_a_search_that_injected_nothing_does_not_throttle_the_next_prompts(tmp_path):
    """QA: a search answered with nothing to inject (no_match) throttled the next two
    prompts, so a new topic right after it was never searched. Only a search that injected
    something, or failed, starts the throttle; a no_match still records its topic, so a
    rephrasing of it is same_topic."""
    answers = {"deploy": 200, "logging": 200, "tests": 503, "flags": 200}

    def handler(conn, request):
        query = request.json()["query"]
        topic = next(t for t in answers if t in query)
        found = [record("mem_logging")] if topic in ("logging", "flags") else []
        reply(answers[topic], results(*found))(conn, request)

    with FakeRelay(handler) as server:
        hook = Hook(tmp_path, server.url)  # throttle_prompts 2, overlap 0.30: the defaults
        steps = [
            ("how do we deploy the billing service to staging?", "no_match", None),
            ("how do we deploy billing to staging, step by step?", "skipped", "same_topic"),
            ("which logging conventions does the worker follow?", "hit", None),
            ("what about flags in the payments worker?", "skipped", "throttled"),
            ("and the feature flags of the search worker?", "skipped", "throttled"),
            ("how are integration tests run against postgres?", "unavailable", None),
            ("what about the feature flags rollout process?", "skipped", "throttled"),
        ]
        for n, (prompt, outcome, reason) in enumerate(steps, 1):
            hook.prompt(prompt)
            entry = hook.last()
            assert (entry["outcome"], entry.get("reason") if reason else None) == (
                outcome,
                reason,
            ), (n, entry)
        state = hook.session_state()
        assert (state["count"], state["last_search"]) == (7, 6)
        assert len(server.requests) == 3


def test_compaction_and_clear_reset_the_ledger_resume_keeps_it(tmp_path):
    with FakeRelay(reply(200, results(record("mem_a"), record("mem_b")))) as server:
        hook = Hook(tmp_path, server.url, RELAY_PROFILE="0")
        assert_hit_contract(hook.prompt("how do we write a database migration?"))
        hook.session_start("resume")
        assert hook.last()["reason"] == "profile_off"
        hook.prompt("how do we write a database migration?", session="sess-1")
        assert hook.session_state()["ledger"] == {"mem_a": 1, "mem_b": 1}
        for source in ("compact", "clear"):
            assert_silent(hook.session_start(source))
            assert hook.session_state()["ledger"] == {}
            # the same question right after compaction brings the records back, once
            context = assert_hit_contract(hook.prompt("how do we write a database migration?"))
            assert "mem_a" in context and "mem_b" in context
            assert_silent(hook.prompt("how do we write a database migration?"))


def test_a_kept_session_is_written_in_place_and_a_shorter_state_leaves_no_old_tail(tmp_path):
    """Each prompt wrote its session's state to a new file renamed over the old one, and ext4
    wrote that file out before the rename returned: up to 440 ms (strace of the hook), in the
    gate, past the deadline (a replay: 17 of 400 prompts of kept sessions over 20 ms, one at
    629 ms; fresh sessions, with no file to replace, none). It is one file throughout now."""
    with FakeRelay(Knowledge()) as server:
        hook = Hook(tmp_path, server.url, RELAY_PROFILE="0", RELAY_THROTTLE_PROMPTS="0")
        path = hook.state_dir / "sessions" / "sess-1.json"
        assert_hit_contract(hook.prompt("how do we write a database migration for the orders?"))
        alias = tmp_path / "alias.json"
        os.link(path, alias)  # a rename over the file would leave the alias the old state
        assert_hit_contract(hook.prompt("how do we deploy the billing service to staging?"))
        assert os.path.samefile(path, alias)
        state = hook.session_state()
        assert state["count"] == 2 and set(state["ledger"]) == {"mem_migrate", "mem_deploy"}
        longer = path.stat().st_size
        assert_silent(hook.session_start("compact"))  # the ledger reset: a shorter state
        assert os.path.samefile(path, alias) and path.stat().st_size < longer
        assert hook.session_state()["ledger"] == {}  # whole JSON: the longer one's tail is gone
        assert "mem_migrate" in assert_hit_contract(
            hook.prompt("how do we write a database migration for the orders?")
        )


def test_a_fifo_or_a_link_in_a_session_files_place_neither_holds_the_hook_nor_is_written(tmp_path):
    """A FIFO where a session's state file goes held the hook on open() until the agent gave up
    on it (the 5 s relay install sets); a link is not written through. Each is replaced."""
    with FakeRelay(Knowledge()) as server:
        hook = Hook(tmp_path, server.url, RELAY_PROFILE="0")
        assert_hit_contract(hook.prompt("how do we deploy the billing service?", session="warm"))
        sessions = hook.state_dir / "sessions"
        os.mkfifo(sessions / "sess-1.json")
        elsewhere = tmp_path / "elsewhere.json"
        elsewhere.write_text("not the hook's")
        (sessions / "sess-2.json").symlink_to(elsewhere)
        for session in ("sess-1", "sess-2"):
            run = hook.prompt("how do we write a database migration for the orders?", session)
            assert "mem_migrate" in assert_hit_contract(run)
            assert stat.S_ISREG((sessions / f"{session}.json").lstat().st_mode)
            assert hook.session_state(session)["ledger"] == {"mem_migrate": 1}
        assert elsewhere.read_text() == "not the hook's"


def test_newer_revision_is_injected_again_same_revision_never(tmp_path):
    answer = {"rev": 1}

    def handler(conn, request):
        reply(200, results(record("mem_a", answer["rev"])))(conn, request)

    with FakeRelay(handler) as server:
        hook = Hook(tmp_path, server.url, RELAY_THROTTLE_PROMPTS="0", RELAY_OVERLAP_THRESHOLD="1.5")
        assert 'revision="1"' in assert_hit_contract(hook.prompt("how do we write a migration?"))
        assert_silent(hook.prompt("how do we write a migration?"))
        assert hook.last()["outcome"] == "no_match" and hook.last()["duplicates"] == 1
        answer["rev"] = 3
        assert 'revision="3"' in assert_hit_contract(hook.prompt("how do we write a migration?"))
        answer["rev"] = 2  # an older revision never returns once a newer one was shown
        assert_silent(hook.prompt("how do we write a migration?"))


def test_each_passage_of_a_revision_is_shown_once_and_a_newer_revision_supersedes_them(tmp_path):
    """QA: the ledger held (id, revision), so once passage 0 of a long memory was shown, passage
    21 of the same revision (a text the model never saw) was dropped as a duplicate."""
    answer: dict = {}

    def handler(conn, request):
        reply(200, results(record("mem_long", **answer)))(conn, request)

    def ask(**fields):
        answer.clear()
        answer.update(fields)
        return hook.prompt("what does the operations handbook say about failover drills?")

    with FakeRelay(handler) as server:
        hook = Hook(tmp_path, server.url, RELAY_THROTTLE_PROMPTS="0", RELAY_OVERLAP_THRESHOLD="1.5")
        context = assert_hit_contract(ask(revision=1, passage=0, passages=22, text="first part"))
        assert '<relay-memory id="mem_long" revision="1" part="1 of 22" source=' in context
        context = assert_hit_contract(ask(revision=1, passage=21, passages=22, text="last part"))
        assert 'revision="1" part="22 of 22"' in context and "last part" in context
        assert hook.last()["duplicates"] == 0
        for seq in (0, 21):  # each shown once: never again in this conversation
            assert_silent(ask(revision=1, passage=seq, passages=22))
            assert hook.last()["outcome"] == "no_match" and hook.last()["duplicates"] == 1
        assert hook.session_state()["ledger"] == {"mem_long": [1, [0, 21]]}
        # a newer revision comes in again, and supersedes every passage of the older one
        assert 'revision="2" part="4 of 9"' in assert_hit_contract(
            ask(revision=2, passage=3, passages=9)
        )
        assert_silent(ask(revision=1, passage=5, passages=22))
        assert hook.last()["duplicates"] == 1
        assert hook.session_state()["ledger"] == {"mem_long": [2, [3]]}
        # a memory of one passage is labelled as before; a server that does not count
        # passages still numbers them
        assert 'revision="3" source=' in assert_hit_contract(ask(revision=3, passage=0, passages=1))
        assert 'revision="4" part="2" source=' in assert_hit_contract(ask(revision=4, passage=1))


def test_a_revision_that_shows_the_same_text_is_not_injected_again(tmp_path):
    """QA: `relay edit` of a tag or the pin writes a revision with identical text, and the
    hook injected that text again in the same session (the ledger is keyed by revision).
    Identical title and text is a duplicate; changed text comes in as before; and so for the
    profile at a resume."""
    fact = "Deploys go through `make deploy`; never push to main on Fridays."
    answer = {"revision": 1, "text": fact}
    pinned = {"revision": 1, "text": "Code review needs two approvals."}

    def handler(conn, request):
        if request.path == "/v1/profile":
            reply(200, results(record("mem_pin", passage=0, **pinned)))(conn, request)
        else:
            reply(200, results(record("mem_deploy", **answer)))(conn, request)

    with FakeRelay(handler) as server:
        hook = Hook(tmp_path, server.url, RELAY_THROTTLE_PROMPTS="0", RELAY_OVERLAP_THRESHOLD="1.5")
        assert "mem_pin" in assert_hit_contract(hook.session_start("startup"), "SessionStart")
        assert fact in assert_hit_contract(hook.prompt("how do we deploy the billing service?"))
        answer["revision"] = 2  # tagged: same title, same text
        assert_silent(hook.prompt("how do we deploy the worker service?"))
        assert (hook.last()["outcome"], hook.last()["duplicates"]) == ("no_match", 1)
        answer.update(revision=3, text=fact + " Tuesdays too.")  # the text changed
        context = assert_hit_contract(hook.prompt("how do we deploy the cron service?"))
        assert 'id="mem_deploy" revision="3"' in context and "Tuesdays too." in context
        pinned["revision"] = 2  # unpinned and pinned again: the same text
        assert_silent(hook.session_start("resume"))
        assert (hook.last()["outcome"], hook.last()["duplicates"]) == ("no_match", 1)
        state = hook.session_state()
    assert state["ledger"] == {"mem_pin": 1, "mem_deploy": 3}  # its format as before
    # per memory, the hash of the latest text shown (whole revisions: no passage numbered)
    assert set(state["shown"]) == {"mem_pin", "mem_deploy"}
    assert all(type(key) is str and len(key) == 12 for key in state["shown"].values())


def test_an_edit_reverted_to_a_text_shown_before_is_injected_again(tmp_path):
    """QA: Thursday (revision 1), edited to Wednesday (2), edited back to Thursday (3): the
    hook dropped revision 3 as a duplicate (a text it had shown once), and the newest copy
    the model held said Wednesday. Only the latest text shown for a memory is a duplicate:
    a tag-only edit after that (4, Thursday again) still injects nothing."""
    fact = "The release freeze starts on {} at noon."
    answer = {"revision": 1, "text": fact.format("Thursday")}

    def handler(conn, request):
        reply(200, results(record("mem_freeze", passage=0, passages=1, **answer)))(conn, request)

    with FakeRelay(handler) as server:
        hook = Hook(tmp_path, server.url, RELAY_THROTTLE_PROMPTS="0", RELAY_OVERLAP_THRESHOLD="1.5")
        for revision, day, prompt in (
            (1, "Thursday", "when does the release freeze start?"),
            (2, "Wednesday", "when exactly is the release freeze?"),
            (3, "Thursday", "remind me about the release freeze day"),
        ):
            answer.update(revision=revision, text=fact.format(day))
            context = assert_hit_contract(hook.prompt(prompt))
            assert f'revision="{revision}"' in context and fact.format(day) in context
        answer["revision"] = 4  # tagged: the text the model holds as the newest
        assert_silent(hook.prompt("is the release freeze still on for this week?"))
        assert (hook.last()["outcome"], hook.last()["duplicates"]) == ("no_match", 1)
    assert [e["injected"] for e in hook.outcomes()[:3]] == [[["mem_freeze", n]] for n in (1, 2, 3)]
    shown = hook.session_state()["shown"]  # the latest text of passage 0 alone
    assert list(shown) == ["mem_freeze"] and shown["mem_freeze"].startswith("0:")
    assert len(shown["mem_freeze"]) == 14


def test_a_passage_that_only_moved_is_not_injected_again_and_is_kept_at_its_new_number(
    tmp_path,
):
    """QA: an edit inserting a section before some passages numbers them anew, and the hook
    injected their unchanged texts again (it knew each text only at its old number). Moved,
    a text is a duplicate, even landing on a number another text had; an edit of it at its
    new number comes in, and so does that edit reverted, after yet another section went in
    (had the moved text stayed known at its old number, it would pass for the latest)."""
    deploy = "Deploys run from the release branch."
    rollback = "Rollbacks use make rollback and a note in the incident channel."
    hotfix = "The on-call engineer approves hotfixes."
    answer: dict = {}

    def handler(conn, request):
        reply(200, results(record("mem_runbook", **answer)))(conn, request)

    with FakeRelay(handler) as server:
        hook = Hook(tmp_path, server.url, RELAY_THROTTLE_PROMPTS="0", RELAY_OVERLAP_THRESHOLD="1.5")

        def ask(revision, passage, passages, text, question):
            answer.update(revision=revision, passage=passage, passages=passages, text=text)
            return hook.prompt(f"what does the runbook say about {question}?")

        for seq, text in enumerate((deploy, rollback, hotfix)):
            assert text in assert_hit_contract(ask(1, seq, 3, text, f"section {seq}"))
        # revision 2: a section inserted first; every passage moves up one
        for seq, text, question in ((1, deploy, "deploys"), (3, hotfix, "hotfixes")):
            assert_silent(ask(2, seq, 4, text, question))
            assert (hook.last()["outcome"], hook.last()["duplicates"]) == ("no_match", 1)
        staging = "Staging is refreshed nightly."
        assert staging in assert_hit_contract(ask(2, 0, 4, staging, "staging"))
        assert_silent(ask(2, 2, 4, rollback, "rollbacks"))
        # revision 3 edits the moved hotfix passage at its new number: it comes in
        edited = hotfix.replace("on-call engineer", "release manager")
        assert edited in assert_hit_contract(ask(3, 3, 4, edited, "hotfix approvals"))
        # revision 4 inserts another section and reverts the edit: the model's newest copy
        # of that passage says "release manager", so the old text comes in again
        context = assert_hit_contract(ask(4, 4, 5, hotfix, "who approves hotfixes"))
        assert hotfix in context and 'revision="4" part="5 of 5"' in context
        assert_silent(ask(5, 2, 5, deploy, "the release branch"))  # moved once more
        assert_silent(ask(5, 4, 5, hotfix, "hotfix rules"))
        assert [len(e.get("injected", [])) for e in hook.outcomes()] == [
            1, 1, 1, 0, 0, 1, 0, 1, 1, 0, 0,
        ]  # fmt: skip
        shown = hook.session_state()["shown"]["mem_runbook"]
    # each text held once: the two placed at their numbers in five passages (implied by the
    # last), the rest of revision 3's numbering unplaced (staging, rollback, the edit)
    tokens = [token.partition(":") for token in shown.split()]
    assert sorted(place for place, _, _ in tokens) == ["2", "4", "~", "~", "~"]
    assert len({key for _, _, key in tokens}) == 5


def write_old_state(hook: Hook, **fields: object) -> None:
    """Session sess-1's file as an older hook wrote it: `fields` over those every version
    kept (a field left out is one that version did not have)."""
    folder = hook.state_dir / "sessions"
    folder.mkdir(parents=True, mode=0o700, exist_ok=True)
    kept = {
        "v": 1,
        "session": "sess-1",
        "keywords": [],
        "told_unauthorized": False,
        "last_prompt_id": "p-old",
        "start": None,
    }
    (folder / "sess-1.json").write_text(json.dumps({**kept, **fields}))


def test_a_state_file_holding_a_list_of_text_hashes_is_read_without_them(tmp_path):
    """A hook kept the hash of every text shown in a `shown` list for a while: such a file
    is read (its ledger keeps its dedupe) and the list, which says not which text is a
    memory's latest, is dropped; the text shown next is kept the new way."""
    fact = "The release freeze starts on Thursday at noon."
    answer = {"revision": 2, "text": fact}

    def handler(conn, request):
        reply(200, results(record("mem_freeze", **answer)))(conn, request)

    with FakeRelay(handler) as server:
        hook = Hook(tmp_path, server.url, RELAY_THROTTLE_PROMPTS="0", RELAY_OVERLAP_THRESHOLD="1.5")
        write_old_state(
            hook,
            count=2,
            last_search=1,
            ledger={"mem_freeze": 2},
            shown=["0123456789ab", "ba9876543210"],
        )
        assert_silent(hook.prompt("when does the release freeze start?"))
        assert (hook.last()["outcome"], hook.last()["duplicates"]) == ("no_match", 1)
        answer.update(revision=3, text=fact.replace("Thursday", "Friday"))
        assert "Friday" in assert_hit_contract(hook.prompt("when is the release freeze now?"))
        state = hook.session_state()
    assert state["ledger"] == {"mem_freeze": 3} and list(state["shown"]) == ["mem_freeze"]


def test_a_ledger_written_before_passages_keeps_its_dedupe(tmp_path):
    """A state file whose ledger holds bare revisions (one passage shown, which one unknown)
    still drops every passage of that revision, and takes a newer one."""
    answer: dict = {}

    def handler(conn, request):
        reply(200, results(record("mem_long", **answer)))(conn, request)

    with FakeRelay(handler) as server:
        hook = Hook(tmp_path, server.url, RELAY_THROTTLE_PROMPTS="0", RELAY_OVERLAP_THRESHOLD="1.5")
        write_old_state(hook, count=4, last_search=3, ledger={"mem_long": 2, "mem_other": 1})
        answer.update(revision=2, passage=21, passages=22)
        assert_silent(hook.prompt("what does the operations handbook say about failover?"))
        assert hook.last()["outcome"] == "no_match" and hook.last()["duplicates"] == 1
        answer.update(revision=3, passage=21, passages=22)
        assert 'revision="3" part="22 of 22"' in assert_hit_contract(
            hook.prompt("what does the operations handbook say about failover drills?")
        )
        assert hook.session_state()["ledger"] == {"mem_other": 1, "mem_long": [3, [21]]}


def test_session_start_injects_profile_and_records_it_in_the_ledger(tmp_path):
    # the profile carries whole memories (passage 0, as the server sends it): a search's
    # passage 3 of the same revision is already in the conversation
    pinned = results(record("mem_style", 2, passage=0), record("mem_oncall", 1, passage=0))
    search = results(record("mem_style", 2, passage=3, passages=5), record("mem_new", 1))

    def handler(conn, request):
        reply(200, pinned if request.path == "/v1/profile" else search)(conn, request)

    with FakeRelay(handler) as server:
        hook = Hook(tmp_path, server.url)
        run = hook.session_start("startup")
        context = assert_hit_contract(run, "SessionStart")
        assert "Relay team profile" in context and "mem_style" in context
        assert server.requests[0].method == "GET" and server.requests[0].path == "/v1/profile"
        assert hook.session_state()["ledger"] == {"mem_style": 2, "mem_oncall": 1}
        context = assert_hit_contract(hook.prompt("what is our code style for python modules?"))
        assert "mem_new" in context and "mem_style" not in context
        assert hook.last()["duplicates"] == 1
        # resume keeps the ledger: the profile is already in the conversation
        assert_silent(hook.session_start("resume"))
        assert hook.last()["outcome"] == "no_match"


def test_a_pinned_memory_shown_cut_at_session_start_leaves_its_passages_to_later_prompts(
    tmp_path,
):
    """A long pinned memory cut to fit profile_max_tokens was recorded as its whole revision
    seen, so a prompt's hit on a passage the model never saw was dropped as a duplicate."""
    pinned = results(
        record("mem_short", 1, passage=0),
        record("mem_runbook", 4, "Step: restart the primary, then the replicas. " * 80),
    )
    tail = "Failover drills run on the first Monday of each quarter, from the standby region."
    search = results(record("mem_runbook", 4, tail, passage=9, passages=10))

    def handler(conn, request):
        reply(200, pinned if request.path == "/v1/profile" else search)(conn, request)

    with FakeRelay(handler) as server:
        hook = Hook(tmp_path, server.url, RELAY_PROFILE_MAX_TOKENS="400")
        context = assert_hit_contract(hook.session_start("startup"), "SessionStart")
        assert 'id="mem_runbook"' in context and "[truncated]" in context
        assert hook.last()["injected"] == [["mem_short", 1], ["mem_runbook", 4]]
        assert hook.session_state()["ledger"] == {"mem_short": 1}  # what was shown whole
        context = assert_hit_contract(hook.prompt("when do we run the failover drills?"))
        assert 'id="mem_runbook" revision="4" part="10 of 10"' in context and tail in context
        assert hook.last()["outcome"] == "hit" and hook.last()["duplicates"] == 0
        assert hook.session_state()["ledger"] == {"mem_short": 1, "mem_runbook": [4, [9]]}


@pytest.mark.parametrize("budget", ["8000", "3000"])
def test_what_the_hook_prints_stays_under_what_claude_code_keeps_whole(tmp_path, budget):
    """QA: profile_max_tokens=8000 and long pinned memories made a SessionStart context of
    23,986 characters; Claude Code keeps 10,000 characters of hook output and shows the
    model a 2,000-character preview of more. A budget over 3000 is capped at 3000; within
    it, text that JSON writes long (beyond ASCII, quotes) is cut."""
    long = "Sécurité: déploiement « vérifié » avant la mise en production. " * 60
    pinned = results(*(record(f"mem_{n}", 1, f'"{n}" {long}', passage=0) for n in range(5)))
    search = results(*(record(f"mem_{n}", 1, long, passage=1, passages=2) for n in range(5)))

    def handler(conn, request):
        reply(200, pinned if request.path == "/v1/profile" else search)(conn, request)

    with FakeRelay(handler) as server:
        hook = Hook(
            tmp_path,
            server.url,
            RELAY_PROFILE_MAX_TOKENS=budget,
            RELAY_MAX_TOKENS=budget,
            RELAY_MAX_RECORDS="5",
        )
        start = hook.session_start("startup")
        assert "[truncated]" in assert_hit_contract(start, "SessionStart")
        prompt = hook.prompt("how do we verify a deploy before production?")
        assert "[truncated]" in assert_hit_contract(prompt)
    for run in (start, prompt):
        assert len(run.out) <= 9_500, len(run.out)
        assert run.out.isascii()  # so its characters are its bytes


@pytest.mark.parametrize("length", [9_000, 40_000])
def test_a_single_long_ascii_record_is_cut_to_the_output_cap(tmp_path, length):
    """Plain text with many newlines and quotes, each two characters in JSON."""
    text = ('He said "run it"\n' * (length // 17))[:length]
    with FakeRelay(reply(200, results(record("mem_a", 1, text)))) as server:
        hook = Hook(tmp_path, server.url, RELAY_MAX_TOKENS="3000")
        run = hook.prompt("what did he say about running it?")
        assert "[truncated]" in assert_hit_contract(run)
    assert len(run.out) <= 9_500
    assert hook.last()["records"] == 1


def test_event_name_on_stdin_selects_session_start(tmp_path):
    with FakeRelay(reply(200, results(record("mem_p")))) as server:
        hook = Hook(tmp_path, server.url)
        run = hook.run(hook.start_payload("startup"))  # no session-start argument
        assert_hit_contract(run, "SessionStart")


def test_concurrent_hooks_of_one_session_never_inject_a_record_twice(tmp_path):
    with FakeRelay(
        reply(200, results(record("mem_a"), record("mem_b"), record("mem_c")))
    ) as server:
        hook = Hook(
            tmp_path,
            server.url,
            RELAY_THROTTLE_PROMPTS="0",
            RELAY_OVERLAP_THRESHOLD="1.5",
            RELAY_DEADLINE_MS="5000",
        )
        done = run_together(
            hook, [hook.payload(f"how do we write migration number {i}?") for i in range(8)]
        )
        assert all(rc == 0 for rc, _ in done)
    contexts = [
        json.loads(out)["hookSpecificOutput"]["additionalContext"] for _, out in done if out
    ]
    for rid in ("mem_a", "mem_b", "mem_c"):
        assert sum(c.count(f'id="{rid}"') for c in contexts) == 1
    state = hook.session_state()
    assert state["count"] == 8
    assert state["ledger"] == {"mem_a": 1, "mem_b": 1, "mem_c": 1}
    assert len(hook.outcomes()) == 8


def test_weak_later_hits_are_not_injected_unless_min_score_allows_them(tmp_path):
    """The server returns the best hit and those within a small share of it; a later hit
    scored 0.05 was relevant one time in 25 on the development data: not worth tokens."""
    answer = reply(200, results(record("mem_a", score=0.62), record("mem_b", score=0.05)))
    with FakeRelay(answer) as server:
        hook = Hook(tmp_path, server.url)
        assert_hit_contract(hook.prompt("where is the staging database configured?"))
        assert [rid for rid, _ in hook.last()["injected"]] == ["mem_a"]
        lenient = Hook(tmp_path / "b", server.url, RELAY_MIN_SCORE="0")
        assert_hit_contract(lenient.prompt("where is the staging database configured?"))
        assert [rid for rid, _ in lenient.last()["injected"]] == ["mem_a", "mem_b"]


def test_a_prompt_that_reaches_the_hook_twice_counts_once(tmp_path):
    """Registered for the user and in a committed project's settings (two different
    commands), the agent runs the hook twice per prompt: the second run of a prompt id in
    a session is skipped, so the throttle and the counts see one prompt (QA, session 6)."""
    with FakeRelay(reply(200, results(record("mem_a")))) as server:
        hook = Hook(tmp_path, server.url)
        twice = hook.payload("how do we write a database migration?", prompt_id="p1")
        done = run_together(hook, [twice, twice])
        assert [rc for rc, _ in done] == [0, 0]
        assert sum(bool(out) for _, out in done) == 1  # one of them injected, the other nothing
        reasons = sorted(str(e.get("reason")) for e in hook.outcomes())
        assert reasons == ["None", "repeat_prompt"]
        # QA: the repeat's time in the session's lock was in no phase of its log line
        assert all("gate" in e["ms"] for e in hook.outcomes()), hook.outcomes()
        assert hook.session_state()["count"] == 1
        # the next prompt is a prompt like any other
        hook.prompt("which logging conventions does the worker follow?", prompt_id="p2")
        assert hook.session_state()["count"] == 2


def test_a_prompt_without_an_id_that_reaches_the_hook_twice_counts_once(tmp_path):
    """QA: with no `prompt_id` in the payload, both runs of a hook registered twice counted
    the prompt, so the throttle let through half the prompts it should. The same text again,
    with no prompt between and within the deadline and a second, is the same prompt."""
    with FakeRelay(reply(200, results(record("mem_a")))) as server:
        # The default 2,000 ms (Hook's): at 400 two hooks started together under load both
        # ran out of time, and neither answered.
        hook = Hook(tmp_path, server.url)
        text = "how do we write a database migration?"
        twice = hook.payload(text, prompt_id=None)
        done = run_together(hook, [twice, twice])
        assert sum(bool(out) for _, out in done) == 1
        assert sorted(str(e.get("reason")) for e in hook.outcomes()) == ["None", "repeat_prompt"]
        assert hook.session_state()["count"] == 1
        # in turn, as an agent that runs its hooks one after the other
        other = "which logging conventions does the worker follow?"
        hook.prompt(other, prompt_id=None)
        hook.prompt(other, prompt_id=None)
        assert hook.last()["reason"] == "repeat_prompt" and hook.session_state()["count"] == 2
        # the same text after another prompt, or once the time is past, is a new prompt
        hook.prompt(text, prompt_id=None)
        assert hook.last().get("reason") != "repeat_prompt"
        assert hook.session_state()["count"] == 3
        path = hook.state_dir / "sessions" / "sess-1.json"
        stored = json.loads(path.read_text())
        stored["last_prompt"]["at"] -= 2.0 + 1.0  # as if the deadline and a second had passed
        path.write_text(json.dumps(stored))
        hook.prompt(text, prompt_id=None)
        assert hook.last().get("reason") != "repeat_prompt"
        assert hook.session_state()["count"] == 4
        assert len(server.requests) <= 2  # the throttle saw each prompt once


def test_a_session_start_that_reaches_the_hook_twice_injects_the_profile_once(tmp_path):
    """Registered for the user and in the project, the hook runs twice per SessionStart
    (Codex concurrently): a second `compact` or `clear` run must not reset the ledger
    the first has just filled and inject the profile again (QA, session 8)."""
    pinned = results(record("mem_style"), record("mem_oncall"))
    with FakeRelay(reply(200, pinned)) as server:
        hook = Hook(tmp_path, server.url, RELAY_THROTTLE_PROMPTS="0")
        assert_hit_contract(hook.session_start("startup"), "SessionStart")
        assert_silent(hook.session_start("startup"))
        assert hook.last()["reason"] == "repeat_start"
        for source in ("compact", "clear"):
            hook.prompt("how do we write a database migration?")
            # in turn: the second starts after the first has ended
            assert_hit_contract(hook.session_start(source), "SessionStart")
            assert_silent(hook.session_start(source))
            assert hook.last()["reason"] == "repeat_start"
            assert hook.session_state()["ledger"] == {"mem_style": 1, "mem_oncall": 1}
            hook.prompt("how do we deploy the billing service?")
            # together, as Codex runs matching hooks
            done = run_together(hook, [hook.start_payload(source)] * 2)
            assert [rc for rc, _ in done] == [0, 0]
            assert sum(bool(out) for _, out in done) == 1, done
            assert hook.session_state()["ledger"] == {"mem_style": 1, "mem_oncall": 1}
        reasons = [e.get("reason") for e in hook.outcomes() if e["event"] == "session_start"]
        assert reasons.count("repeat_start") == 5
        assert len(server.requests) == 5 + 4  # one profile per start, and the four prompts


def test_a_later_session_start_of_the_same_source_resets_again(tmp_path):
    """Only a duplicate counts once: a compaction after a prompt, or one past the time the
    first run of a start could take, resets the ledger and brings the profile back."""
    with FakeRelay(reply(200, results(record("mem_style")))) as server:
        # The default 2,000 ms (Hook's): at 400 a start under load could answer nothing.
        hook = Hook(tmp_path, server.url)
        assert_hit_contract(hook.session_start("compact"), "SessionStart")
        hook.prompt("ok")  # a prompt in between: the next compaction is a new one
        assert_hit_contract(hook.session_start("compact"), "SessionStart")
        # no prompt in between, but later than a duplicate run could start
        path = hook.state_dir / "sessions" / "sess-1.json"
        stored = json.loads(path.read_text())
        stored["start"]["at"] -= 2.0 + 1.0
        path.write_text(json.dumps(stored))
        assert_hit_contract(hook.session_start("compact"), "SessionStart")
        assert hook.last()["ledger_reset"] is True
        # another source is another event
        assert_hit_contract(hook.session_start("clear"), "SessionStart")
    assert len(server.requests) == 4


def stale_sessions(tmp_path, count: int):
    """`count` sessions last written an hour past the TTL, in the hook's state folder."""
    import os
    import time

    from relay.hook import state

    folder = tmp_path / "state" / "sessions"
    folder.mkdir(parents=True, mode=0o700)
    old = time.time() - state.SESSION_TTL_S - 3600
    for i in range(count):
        for ext in (".json", ".lock"):
            path = folder / f"old-{i}{ext}"
            path.write_text("{}" if ext == ".json" else "")
            os.utime(path, (old, old))
    return folder


def test_a_hit_sweeps_old_sessions_within_a_small_budget_and_logs_it(tmp_path):
    """20,000 files of week-old sessions made the first hit take 644 ms while its log said
    62 ms (QA): the sweep after a hit stops after a few milliseconds, the rest is left to
    later hits, and the log's total covers the sweep."""
    folder = stale_sessions(tmp_path, 2000)
    with FakeRelay(reply(200, results(record("mem_a")))) as server:
        hook = Hook(tmp_path, server.url)
        assert_hit_contract(hook.prompt("how do we write a database migration?"))
    entry = hook.last()
    assert entry["outcome"] == "hit"
    assert 0 <= entry["ms"]["cleanup"] <= entry["ms"]["total"]
    left = len([p for p in folder.iterdir() if p.name.startswith("old-")])
    assert left > 2 * 2000 - 2 * 400  # a few milliseconds' worth went, not all of them
    assert (folder / "sess-1.json").exists()


def test_a_sweep_stamp_from_before_the_clock_was_set_back_does_not_stop_the_sweeps(tmp_path):
    """The last sweep ran while the clock was a day fast; set right, the next session start
    sweeps as due, rather than no sweep at all for that day while stale sessions pile up."""
    import os
    import time

    folder = stale_sessions(tmp_path, 20)
    stamp = folder / ".cleaned"
    stamp.write_text("")
    ahead = time.time() + 86400
    os.utime(stamp, (ahead, ahead))
    with FakeRelay(reply(200, results(record("mem_a", pinned=True)))) as server:
        hook = Hook(tmp_path, server.url)
        hook.session_start("startup")
    assert not [p for p in folder.iterdir() if p.name.startswith("old-")]
    assert stamp.stat().st_mtime <= time.time()


def test_chit_chat_made_of_quantifiers_and_particles_does_not_search(tmp_path):
    """QA: "please continue with that, thanks a lot" searched, on "lot": the filler list
    held English function words but not the closed classes of quantifiers and degree words
    ("lot", "much") or of phrasal-verb particles ("ahead"); a prompt made of them names no
    topic. The words of one that does still search."""
    with FakeRelay(reply(200, results())) as server:
        hook = Hook(tmp_path, server.url, RELAY_THROTTLE_PROMPTS="0")
        for prompt in (
            "please continue with that, thanks a lot",
            "go ahead, thank you so much",
            "perfect, that's quite enough, thanks",
        ):
            assert_silent(hook.prompt(prompt))
            assert hook.last()["reason"] == "no_keywords", (prompt, hook.last())
        assert server.requests == []
        assert_silent(hook.prompt("roll back the orders migration, thanks a lot"))
        assert hook.last()["outcome"] == "no_match"
        assert server.requests[0].json()["query"].startswith("roll back the orders migration")


def test_a_prompt_whose_whole_answer_min_score_dropped_says_so_in_the_log_and_stats(tmp_path):
    """QA: with min_score 0.8 a server answer scored 0.57 was logged `no_match, results 0`,
    like a server that found nothing: nothing told a team its floor kept every hit back."""
    answer = reply(200, results(record("mem_a", score=0.57), record("mem_b", score=0.3)))
    with FakeRelay(answer) as server:
        hook = Hook(tmp_path, server.url, RELAY_MIN_SCORE="0.8")
        assert_silent(hook.prompt("where is the staging database configured?"))
        last = hook.last()
        assert (last["outcome"], last["results"], last["below_min_score"]) == ("no_match", 0, 2)
        kept = Hook(tmp_path / "b", server.url, RELAY_MIN_SCORE="0.5")
        assert_hit_contract(kept.prompt("where is the staging database configured?"))
        assert (kept.last()["results"], kept.last()["below_min_score"]) == (1, 1)
    state = str(tmp_path / "state")
    text = CliRunner().invoke(stats, ["--state-dir", state, "--since", "all"]).output
    searched, _, _ = text.partition("  not searched")
    assert "    no_match          1\n      below_min_score           1\n" in searched, text
