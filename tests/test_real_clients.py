"""The real agents, offline: Claude Code and Codex, at the versions pinned in e2e/package.json,
run what `relay install` registered against a real `relay serve`, and a fake model API records
what the model actually received.

The binaries come from `npm ci --prefix e2e` (scripts/setup.sh --dev runs it when node and npm
are on the PATH); RELAY_TEST_CLAUDE_BIN / RELAY_TEST_CODEX_BIN point elsewhere. Missing
binaries fail the suite (CI=true, or node present: run the npm install); a machine without
node skips it. Marker: `clients` (`-m "not clients"` leaves it out).

One conversation per client, as a user has it: a prompt that needs a memory, a same-topic
follow-up and a "continue" in the same session (`--resume` / `codex exec resume`), a prompt
about something else, a compaction, the needed prompt again, and the same once more with the
hook's gates opened so only the conversation ledger stands between it and a second copy.
Then the failure modes, each in a fresh HOME: server stopped, server hung, key revoked,
RELAY_MEMORY_OFF=1. Then the MCP server through each client's own listing and a tool call.

What each client version sends to the hook (stdin fields) and how it shows the hook's context
to the model (wrapper text, message role) is pinned below and in tests/clients_support.py; a
new client version that changes either fails here with a message saying what changed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import httpx
import pytest
from clients_support import (
    CLAUDE_VERSION,
    CODEX_VERSION,
    E2E,
    HOOK_STDIN_LOG,
    AgentClient,
    ClaudeClient,
    CodexClient,
    FakeModelApi,
    HungServer,
    Recorded,
    Reply,
    Turn,
    add_stdin_recorder,
    client_bin,
    closed_port_url,
    count_in,
    memory_tag,
    missing_clients_message,
    node_available,
    read_jsonl,
    strings,
)
from integration_support import mint, relay, remember, revoke, start_module_server, stop_server

from relay import json_text
from relay.hook.pack import PROFILE_INTRO, PROMPT_INTRO, PROMPT_REMINDER, tokens
from relay.hook.run import UNAUTHORIZED_MESSAGE
from relay.hook.state import session_file_stem

pytestmark = pytest.mark.clients

NEEDED = "which cluster do we deploy staging to?"
FOLLOW_UP = "and is staging on the blue cluster for deploys?"
CONTINUE = "continue"
UNRELATED = "how do I center a div with CSS grid?"
CLUSTERS_V1 = "Staging is the blue cluster."
CLUSTERS = "Staging is the blue cluster; production is the green cluster. Deploy staging first."
PROFILE = "We do trunk-based development: every change lands on main behind a feature flag."
RUNBOOK = (
    "Staging deploy runbook. Before a staging deploy, announce it in the deploys channel, check "
    "that the migrations job for the release has finished, and freeze merges to main for the "
    "length of the rollout. The deploy pipeline builds one image per commit, tags it with the "
    "short hash, and promotes the same image from staging to production; nothing is rebuilt. "
) * 4  # about 500 tokens: with the clusters memory it does not fit the 600-token budget
MAX_TOKENS = 600  # the hook's default budget per prompt, labels and provenance included
MAX_RECORDS = 3
DEADLINE_MS = 400
AGENT_HOOK_TIMEOUT_MS = 5000  # what relay install registers: the agents' own backstop
HOOK_SLACK_MS = 1000  # a loaded 2-core machine may deschedule the hook past its deadline

# What each client version sends on the hook's stdin (observed, pinned), per event and, for
# SessionStart, per source. Relay reads session_id, prompt, prompt_id or turn_id,
# hook_event_name and source; the rest is pinned so that a change is noticed, not silently used.
_CLAUDE_BASE = {"session_id", "transcript_path", "cwd", "hook_event_name"}
_CODEX_BASE = {
    "session_id",
    "transcript_path",
    "cwd",
    "hook_event_name",
    "model",
    "permission_mode",
}
STDIN_FIELDS = {
    "claude-code": {
        "UserPromptSubmit": _CLAUDE_BASE | {"prompt_id", "permission_mode", "prompt"},
        "SessionStart:startup": _CLAUDE_BASE | {"source"},
        "SessionStart:resume": _CLAUDE_BASE | {"source"},
        "SessionStart:compact": _CLAUDE_BASE | {"source", "model", "prompt_id"},
    },
    "codex": {
        "UserPromptSubmit": _CODEX_BASE | {"turn_id", "prompt"},
        "SessionStart:startup": _CODEX_BASE | {"source"},
        "SessionStart:resume": _CODEX_BASE | {"source"},
        "SessionStart:compact": _CODEX_BASE | {"source"},
    },
}
CLIENTS = {"claude-code": ClaudeClient, "codex": CodexClient}


# -- the binaries ------------------------------------------------------------------------
def require_clients() -> None:
    missing = [name for name in ("claude", "codex") if not client_bin(name).exists()]
    if not missing:
        return
    in_ci = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
    if in_ci or node_available():
        pytest.fail(missing_clients_message(missing), pytrace=False)
    pytest.skip("node and npm are not installed, so the pinned agent clients cannot be")


def test_the_installed_clients_are_the_pinned_versions():
    require_clients()
    pins = json.loads((E2E / "package.json").read_text())["dependencies"]
    assert pins == {"@anthropic-ai/claude-code": CLAUDE_VERSION, "@openai/codex": CODEX_VERSION}, (
        "e2e/package.json moved a client version: update CLAUDE_VERSION / CODEX_VERSION in "
        "tests/clients_support.py once this suite passes against it"
    )
    lock = json.loads((E2E / "package-lock.json").read_text())["packages"]
    for platform in ("@anthropic-ai/claude-code-linux-x64", "@openai/codex-linux-x64"):
        assert f"node_modules/{platform}" in lock, f"the lockfile lacks {platform}"
    for name, version in (("claude", CLAUDE_VERSION), ("codex", CODEX_VERSION)):
        out = subprocess.run(
            [str(client_bin(name)), "--version"], capture_output=True, text=True, timeout=60
        ).stdout
        assert version in out, f"{client_bin(name)} reports {out.strip()!r}, pinned {version}"


def test_a_changed_context_wrapper_fails_with_what_changed():
    """No binaries needed: the checks the conversation tests rely on, on made-up requests."""
    context = (
        PROMPT_INTRO
        + '\n<relay-memory id="m1" revision="1" source="s" updated="d">\nx\n</relay-memory>'
    )
    api = FakeModelApi()
    try:
        claude, codex = ClaudeClient(api), CodexClient(api)
    finally:
        api.close()
    user = {"role": "user", "content": [{"type": "text", "text": NEEDED}]}
    pinned = {
        "role": "system",
        "content": "skills...\n\n" + claude.WRAPPERS["UserPromptSubmit"] + context,
    }
    assert claude.contexts({"messages": [user, pinned]}, NEEDED, PROMPT_INTRO) == [context]
    moved = {"role": "user", "content": [{"type": "text", "text": "Hook says: " + context}]}
    with pytest.raises(AssertionError, match="changed how it shows .* now 'Hook says: '"):
        claude.contexts({"messages": [user, moved]}, NEEDED, PROMPT_INTRO)
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": NEEDED}]}
    dev = {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": context}],
    }
    assert codex.contexts({"input": [item, dev]}, NEEDED, PROMPT_INTRO) == [context]
    wrapped = {**dev, "content": [{"type": "input_text", "text": "<hook>" + context + "</hook>"}]}
    with pytest.raises(AssertionError, match="changed how it shows"):
        codex.contexts({"input": [item, wrapped]}, NEEDED, PROMPT_INTRO)


# -- the Relay side ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    require_clients()
    live = start_module_server(tmp_path_factory, "real-clients")
    key = live.admin_key
    clusters = remember(live.url, key, body=CLUSTERS_V1, title="Clusters", source="team/infra")
    edited = httpx.patch(
        f"{live.url}/v1/memories/{clusters['id']}",
        json={"body": CLUSTERS},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert edited.status_code == 200 and edited.json()["revision"] == 2, edited.text
    remember(live.url, key, body=RUNBOOK, title="Staging deploys", source="team/runbooks")
    profile = remember(
        live.url, key, body=PROFILE, title="Workflow", source="team/process", pinned=True
    )
    remember(
        live.url, key, body="The office coffee machine is descaled every Friday.", source="office"
    )
    live.clusters = clusters["id"]  # type: ignore[attr-defined]
    live.profile = profile["id"]  # type: ignore[attr-defined]
    yield live
    stop_server(live)


def make_home(
    tmp: Path, client: AgentClient, url: str, key: str, recorder: bool = False, **env: str
) -> Path:
    """A HOME where `relay install` (run with `env`) wired Relay into `client`."""
    home = tmp / "home"
    (home / "work").mkdir(parents=True)
    done = relay(home, "install", "--url", url, "--key", key, "--agent", client.name, **env)
    assert done.returncode == 0, done.stderr
    client.prepare(home)
    if recorder:
        add_stdin_recorder(client.hooks_file(home))
    return home


def point_hook_at(home: Path, url: str) -> None:
    """The server moved or died after install: the config names a URL that no longer answers."""
    config = home / ".relay/config.json"
    doc = json.loads(config.read_text())
    doc["url"] = url
    config.write_text(json.dumps(doc))


def set_knobs(home: Path, **knobs: str) -> None:
    """Edit the installed hook script's knobs, as a user would (they apply from the next prompt)."""
    script = home / ".relay/relay-autosearch-hook.sh"
    text = script.read_text()
    for name, value in knobs.items():
        text, n = re.subn(rf"^{name}=.*$", f"{name}={value}", text, flags=re.M)
        assert n == 1, f"{name} not in {script}"
    script.write_text(text)


# -- what the model received ---------------------------------------------------------------
def prompt_call(client: AgentClient, turn: Turn) -> Recorded:
    """The last model call of the run whose newest user turn is the prompt."""
    assert turn.run.returncode == 0, turn.describe()
    calls = [c for c in turn.calls if client.turn_items(c.body, turn.prompt) is not None]
    assert calls, f"the prompt never reached the model\n{turn.describe()}"
    return calls[-1]


# What every prompt context opens with, the full preamble or the short one after it.
PROMPT_OPENING = os.path.commonprefix([PROMPT_INTRO, PROMPT_REMINDER])


def new_contexts(client: AgentClient, turn: Turn) -> list[str]:
    return client.contexts(prompt_call(client, turn).body, turn.prompt, PROMPT_OPENING)


def blocks(context: str) -> list[dict]:
    """The <relay-memory ...> records of a context: attributes and text."""
    found = re.findall(r"<relay-memory ([^>]*)>\n(.*?)\n</relay-memory>", context, flags=re.S)
    return [{**dict(re.findall(r'(\w+)="([^"]*)"', attrs)), "text": text} for attrs, text in found]


def hook_problems(client: AgentClient, turn: Turn) -> list[str]:
    """Hook errors the client showed the user during the run (an empty list is the goal)."""
    problems = []
    if isinstance(client, ClaudeClient):
        for shown in turn.shown:
            if shown.get("type") not in client.SHOWN_OK:
                problems.append(json.dumps(shown)[:400])
        if (turn.result or {}).get("is_error"):
            problems.append(f"result is_error: {turn.result}")
        if turn.run.stderr.strip():
            problems.append(f"stderr: {turn.run.stderr.strip()[:400]}")
    else:
        for shown in turn.shown:
            if shown["status"] not in ("", "Completed"):
                problems.append(shown["line"])
        for line in turn.run.stderr.splitlines():  # any other word about hooks, e.g. a warning
            if "hook" in line.lower() and not line.startswith(CodexClient.HOOK_LINE):
                if "--dangerously-bypass-hook-trust" not in line:  # the suite's own flag
                    problems.append(line)
    return problems


def system_messages(client: AgentClient, turn: Turn) -> list[str]:
    if isinstance(client, ClaudeClient):
        return [s.get("content", "") for s in turn.shown if s.get("type") == "hook_system_message"]
    return []  # codex exec 0.171.0 does not print a hook's systemMessage (its TUI may)


# -- one conversation per client -------------------------------------------------------------
class Conversation:
    def __init__(self, client: AgentClient, home: Path) -> None:
        self.client = client
        self.home = home
        self.turns: dict[str, Turn] = {}
        self.session = ""

    def say(self, step: str, prompt: str, **kw) -> Turn:
        turn = self.client.run(self.home, step, prompt, session=self.session or None, **kw)
        assert turn.run.returncode == 0, turn.describe()
        if not self.session:
            self.session = turn.session_id
            assert self.session, f"no session id\n{turn.describe()}"
        self.turns[step] = turn
        return turn


@pytest.fixture(scope="module", params=["claude-code", "codex"])
def talk(request, server, tmp_path_factory):
    api = FakeModelApi()
    client = CLIENTS[request.param](api)
    home = make_home(
        tmp_path_factory.mktemp(f"talk-{request.param}"),
        client,
        server.url,
        server.admin_key,
        recorder=True,
    )
    chat = Conversation(client, home)
    try:
        chat.say("needed", NEEDED)
        chat.say("follow_up", FOLLOW_UP)
        chat.say("continue", CONTINUE)
        if isinstance(client, CodexClient):
            # Report a context this large that Codex compacts before the next turn (the
            # suite passes model_auto_compact_token_limit=20000), as it does in a long session.
            api.respond = lambda rec: Reply(input_tokens=90_000)
        chat.say("unrelated", UNRELATED)
        api.respond = None
        if isinstance(client, ClaudeClient):
            chat.say("compact", "/compact")
        chat.say("after_compaction", NEEDED)
        set_knobs(home, THROTTLE_PROMPTS="0", OVERLAP_THRESHOLD="2.00")
        chat.say("gates_open", NEEDED)
        yield chat
    finally:
        api.close()


def test_a_prompt_that_needs_a_memory_carries_it_once_with_label_source_and_revision(talk, server):
    turn = talk.turns["needed"]
    contexts = new_contexts(talk.client, turn)
    assert len(contexts) == 1, f"expected one Relay context, got {len(contexts)}\n{turn.describe()}"
    context = contexts[0]
    # The team profile's full preamble opened the session, so this context has the short one.
    assert context.startswith(PROMPT_REMINDER + "\n<relay-memory "), context[:300]
    records = blocks(context)
    needed = [r for r in records if r.get("id") == server.clusters]
    assert len(needed) == 1, f"the clusters memory is not in the context:\n{context}"
    assert needed[0]["revision"] == "2" and needed[0]["source"] == "team/infra", needed[0]
    assert needed[0]["text"] == f"Clusters: {CLUSTERS}", needed[0]["text"]
    assert len(records) <= MAX_RECORDS and tokens(context) <= MAX_TOKENS, (
        f"{len(records)} records, {tokens(context)} tokens: over the hook's budget\n{context}"
    )
    body = prompt_call(talk.client, turn).body
    assert count_in(body, memory_tag(server.clusters)) == 1, "the memory reached the model twice"
    logged = turn.prompt_outcome()
    assert logged["outcome"] == "hit" and [server.clusters, 2] in logged["injected"], logged
    assert logged["tokens"] == tokens(context), (
        f"the model got {tokens(context)} tokens of context, the hook printed {logged['tokens']}: "
        f"{talk.client.label} altered the context on the way"
    )
    assert hook_problems(talk.client, turn) == []


def test_the_team_profile_arrives_at_session_start(talk, server):
    turn = talk.turns["needed"]
    body = prompt_call(talk.client, turn).body
    profiles = talk.client.contexts(body, turn.prompt, PROFILE_INTRO, event="SessionStart")
    assert len(profiles) == 1, f"expected the profile once, got {profiles}\n{turn.describe()}"
    (record,) = blocks(profiles[0])
    assert record["id"] == server.profile and record["source"] == "team/process", record
    assert count_in(body, memory_tag(server.profile)) == 1


def test_a_same_topic_follow_up_carries_no_second_copy(talk, server):
    turn = talk.turns["follow_up"]
    assert new_contexts(talk.client, turn) == [], turn.describe()
    body = prompt_call(talk.client, turn).body
    assert count_in(body, memory_tag(server.clusters)) == 1, (
        "the follow-up's request holds the memory other than once (the first turn's copy)"
    )
    assert turn.session_id == talk.session, "the resumed run is another session"
    assert turn.prompt_outcome()["outcome"] == "skipped", turn.prompt_outcome()
    assert hook_problems(talk.client, turn) == []


def test_continue_carries_nothing(talk, server):
    turn = talk.turns["continue"]
    assert new_contexts(talk.client, turn) == [], turn.describe()
    assert count_in(prompt_call(talk.client, turn).body, memory_tag(server.clusters)) == 1
    assert turn.prompt_outcome()["reason"] == "short_prompt", turn.prompt_outcome()
    assert hook_problems(talk.client, turn) == []


def test_a_prompt_with_nothing_relevant_carries_nothing(talk):
    turn = talk.turns["unrelated"]
    assert new_contexts(talk.client, turn) == [], turn.describe()
    logged = turn.prompt_outcome()
    assert logged["outcome"] == "no_match" and logged["results"] == 0, (
        f"the server answered an unrelated prompt with {logged.get('results')} result(s): {logged}"
    )
    assert hook_problems(talk.client, turn) == []


def test_after_compaction_the_needed_memory_returns_once(talk, server):
    compaction = talk.turns.get("compact") or talk.turns["after_compaction"]
    starts = [o for o in compaction.outcomes if o.get("event") == "session_start"]
    assert any(o.get("source") == "compact" and o.get("ledger_reset") for o in starts), (
        f"{talk.client.label} ran no SessionStart with source 'compact'\n{compaction.describe()}"
    )
    if isinstance(talk.client, ClaudeClient):
        assert compaction.calls, f"/compact made no summarising call\n{compaction.describe()}"
        assert hook_problems(talk.client, compaction) == []
    turn = talk.turns["after_compaction"]
    body = prompt_call(talk.client, turn).body
    contexts = new_contexts(talk.client, turn)
    assert len(contexts) == 1 and memory_tag(server.clusters) in contexts[0], turn.describe()
    assert count_in(body, memory_tag(server.clusters)) == 1, (
        "after compaction the request should hold the memory exactly once (the new injection)"
    )
    assert count_in(body, memory_tag(server.profile)) == 1, "the profile did not come back once"
    assert turn.prompt_outcome()["outcome"] == "hit", turn.prompt_outcome()
    assert hook_problems(talk.client, turn) == []


def test_the_ledger_alone_prevents_a_second_copy(talk, server):
    turn = talk.turns["gates_open"]
    logged = turn.prompt_outcome()
    assert logged.get("duplicates", 0) >= 1, (
        f"with throttle and overlap gates open the hook should have searched and dropped the "
        f"memory as already in this conversation: {logged}"
    )
    body = prompt_call(talk.client, turn).body
    assert count_in(body, memory_tag(server.clusters)) == 1, "a second copy reached the model"
    assert all(memory_tag(server.clusters) not in c for c in new_contexts(talk.client, turn))
    assert hook_problems(talk.client, turn) == []


def test_what_the_client_sends_to_the_hook_is_what_relay_reads(talk):
    name = talk.client.name
    seen = read_jsonl(talk.home / HOOK_STDIN_LOG)
    assert seen, "the recorder hook never ran"
    for payload in seen:
        event = payload.get("hook_event_name")
        if event == "SessionStart":
            event = f"SessionStart:{payload.get('source')}"
        assert event in STDIN_FIELDS[name], f"{talk.client.label} sent something new: {payload}"
        pinned = STDIN_FIELDS[name][event]
        got = set(payload)
        assert got == pinned, (
            f"{talk.client.label} changed the {event} hook's stdin: added {sorted(got - pinned)}, "
            f"removed {sorted(pinned - got)} (pinned {sorted(pinned)}); check relay/hook/run.py "
            f"still finds session_id, prompt, prompt_id/turn_id, hook_event_name and source"
        )
        assert payload["session_id"] == talk.session, (
            f"{talk.client.label} gave one conversation two session ids ({payload['session_id']} "
            f"and {talk.session}): the hook's ledger and throttle would reset on every resume"
        )
    prompts = [p["prompt"] for p in seen if p["hook_event_name"] == "UserPromptSubmit"]
    typed = [t.prompt for t in talk.turns.values() if not t.prompt.startswith("/")]
    assert prompts == typed, f"the hook saw prompts {prompts}, the user typed {typed}"
    ids = [p.get("prompt_id") or p.get("turn_id") for p in seen if "prompt" in p]
    assert len(set(ids)) == len(ids) and all(isinstance(i, str) and i for i in ids), ids
    sources = [p["source"] for p in seen if p["hook_event_name"] == "SessionStart"]
    assert {"startup", "resume", "compact"} <= set(sources), (
        f"{talk.client.label} SessionStart sources seen: {sources}"
    )


# -- failure modes: the prompt goes on, promptly, with nothing and no error ----------------------
FAILURES = {
    "server_stopped": ("unavailable", None),
    "server_hung": ("timeout", None),
    "key_revoked": ("unauthorized", None),
    "memory_off": ("disabled", "memory_off"),
}


@pytest.mark.parametrize("client_name", ["claude-code", "codex"])
@pytest.mark.parametrize("failure", list(FAILURES))
def test_a_failing_recall_never_holds_or_breaks_the_prompt(failure, client_name, server, tmp_path):
    api = FakeModelApi()
    client = CLIENTS[client_name](api)
    hung = None
    key = server.admin_key
    env = None
    try:
        if failure == "key_revoked":
            minted = mint(server.url, server.admin_key, f"revoked-{client_name}", ["memory:read"])
            key = minted["secret"]
        home = make_home(tmp_path, client, server.url, key)
        if failure == "key_revoked":
            revoke(server.url, server.admin_key, minted["id"])
        elif failure == "server_stopped":
            point_hook_at(home, closed_port_url())
        elif failure == "server_hung":
            hung = HungServer()
            point_hook_at(home, hung.url)
        elif failure == "memory_off":
            env = {"RELAY_MEMORY_OFF": "1"}
        turn = client.run(home, failure, NEEDED, env=env)
    finally:
        api.close()
        if hung:
            hung.close()
    call = prompt_call(client, turn)
    everything = [c.body for c in turn.calls]
    assert count_in(everything, "<relay-memory") == 0, "memory reached the model"
    assert count_in(everything, "Relay team memory") == 0, "a Relay label reached the model"
    assert count_in(everything, "rejected this machine's API key") == 0, (
        "the revoked-key notice reached the model; it is for the user only"
    )
    assert hook_problems(client, turn) == [], turn.describe()
    outcome, reason = FAILURES[failure]
    for logged in turn.outcomes:  # the prompt's and the session start's
        assert logged["outcome"] == outcome, turn.describe()
        if reason:
            assert logged.get("reason") == reason, logged
        assert logged["ms"]["total"] <= DEADLINE_MS + HOOK_SLACK_MS, (
            f"the hook took {logged['ms']['total']} ms against a {DEADLINE_MS} ms deadline"
        )
    assert {o["event"] for o in turn.outcomes} == {"prompt", "session_start"}, turn.describe()
    if isinstance(client, ClaudeClient):
        assert turn.result and turn.result["time_to_request_ms"] < AGENT_HOOK_TIMEOUT_MS, (
            f"Claude Code took {turn.result and turn.result['time_to_request_ms']} ms to send the "
            "prompt: it waited for the hook's timeout"
        )
    assert call is not None
    notices = system_messages(client, turn)
    if failure == "key_revoked":
        expected = UNAUTHORIZED_MESSAGE.format(status=401)
        if isinstance(client, ClaudeClient):
            assert notices == [expected], f"the user should see the notice once: {notices}"
        state = json.loads(
            Path(
                session_file_stem(str(home / ".relay/state"), turn.session_id) + ".json"
            ).read_text()
        )
        assert state["told_unauthorized"] is True, "the hook did not print the notice"
    else:
        assert notices == [], notices


@pytest.mark.parametrize("client_name", ["claude-code", "codex"])
@pytest.mark.parametrize("breakage", ["knob_typo", "relay_hook_moved"])
def test_a_broken_relay_script_never_blocks_the_prompt(breakage, client_name, server, tmp_path):
    """QA: `DEADLINE_MS="400` (one stray quote) made the script exit 2 with a syntax error,
    and Claude Code blocks, and erases, a prompt whose hook exits 2; a moved venv made it
    exit 127 with `exec: .../relay-hook: not found` on every prompt. Now the prompt goes on
    with no error shown, and past a typo in a knob recall goes on too (the value is ignored).
    No "hook" in this test's name: Codex prints the temporary path, where hook_problems looks."""
    api = FakeModelApi()
    client = CLIENTS[client_name](api)
    try:
        home = make_home(tmp_path, client, server.url, server.admin_key)
        script = home / ".relay/relay-autosearch-hook.sh"
        text = script.read_text()
        if breakage == "knob_typo":
            broken = text.replace("DEADLINE_MS=400", 'DEADLINE_MS="400')
        else:
            broken = re.sub(
                r"^exec /\S+/relay-hook", "exec /gone/venv/bin/relay-hook", text, flags=re.M
            )
        assert broken != text
        script.write_text(broken)
        turn = client.run(home, breakage, NEEDED)
    finally:
        api.close()
    assert prompt_call(client, turn), turn.describe()
    assert hook_problems(client, turn) == [], turn.describe()
    body = prompt_call(client, turn).body
    if breakage == "knob_typo":
        assert count_in(body, memory_tag(server.clusters)) == 1, turn.describe()
        assert turn.prompt_outcome()["outcome"] == "hit", turn.describe()
    else:
        assert count_in(body, "<relay-memory") == 0 and turn.outcomes == [], turn.describe()


@pytest.mark.parametrize("client_name", ["claude-code", "codex"])
def test_the_suite_would_see_a_hook_error(client_name, server, tmp_path):
    """The control for every "no hook error shown" above: a hook that fails is seen."""
    api = FakeModelApi()
    client = CLIENTS[client_name](api)
    try:
        home = make_home(tmp_path, client, server.url, server.admin_key)
        hooks = client.hooks_file(home)
        doc = json.loads(hooks.read_text())
        broken = {"type": "command", "command": "echo broken >&2; exit 1", "timeout": 5}
        doc["hooks"]["UserPromptSubmit"].append({"hooks": [broken]})
        hooks.write_text(json.dumps(doc))
        turn = client.run(home, "broken_hook", NEEDED)
    finally:
        api.close()
    assert prompt_call(client, turn)
    problems = hook_problems(client, turn)
    assert len(problems) == 1 and ("broken" in problems[0] or "Failed" in problems[0]), (
        f"{client.label} no longer shows a failing hook the way this suite looks for it "
        f"(Claude Code: a hook_non_blocking_error transcript attachment; Codex: a "
        f"'hook: UserPromptSubmit Failed' line): {problems}\n{turn.describe()}"
    )


@pytest.mark.parametrize("client_name", ["claude-code", "codex"])
@pytest.mark.parametrize("extra", ["comment", "trailing_comma"])
def test_a_hooks_file_with_a_comment_runs_none_of_its_hooks(extra, client_name, server, tmp_path):
    """Why `relay install` refuses JSON with comments rather than edit around them: both
    pinned clients read their hooks file as strict JSON and skip all of one that holds a
    comment or a trailing comma, Relay's hooks with the rest (Codex warns on stderr; Claude
    Code -p says nothing). A client version that reads such a file fails here."""
    api = FakeModelApi()
    client = CLIENTS[client_name](api)
    try:
        home = make_home(tmp_path, client, server.url, server.admin_key)
        hooks = client.hooks_file(home)
        text = hooks.read_text()
        if extra == "comment":
            text = "{\n  // the team's hooks\n" + text[2:]
        else:
            text = text.rstrip()[:-1].rstrip() + ",\n}\n"
        assert json_text.jsonc_extras(text), text  # what install names and refuses
        hooks.write_text(text)
        turn = client.run(home, f"hooks_file_{extra}", NEEDED)
    finally:
        api.close()
    body = prompt_call(client, turn).body
    assert count_in(body, "<relay-memory") == 0 and turn.outcomes == [], turn.describe()


@pytest.mark.parametrize("client_name", ["claude-code", "codex"])
def test_a_hooks_file_with_a_bom_runs_its_hooks_in_claude_code_only(client_name, server, tmp_path):
    """Why `relay install` edits a Claude Code settings.json that opens with a UTF-8 byte order
    mark (keeping it) but refuses such a Codex hooks.json: Claude Code reads past the BOM and
    runs the hooks; Codex runs none of them. A client version that changes either fails here."""
    api = FakeModelApi()
    client = CLIENTS[client_name](api)
    try:
        home = make_home(tmp_path, client, server.url, server.admin_key)
        hooks = client.hooks_file(home)
        hooks.write_bytes(b"\xef\xbb\xbf" + hooks.read_bytes())
        turn = client.run(home, "hooks_file_bom", NEEDED)
    finally:
        api.close()
    carried = count_in(prompt_call(client, turn).body, "<relay-memory")
    if client_name == "claude-code":
        assert carried >= 1 and "hit" in [o.get("outcome") for o in turn.outcomes], turn.describe()
    else:
        assert carried == 0 and turn.outcomes == [], turn.describe()


def test_codex_reads_a_config_toml_with_a_bom_so_install_edits_it(server, tmp_path):
    """Why `relay install` edits a Codex config.toml that opens with a UTF-8 byte order mark
    (keeping it), unlike a hooks.json with one: Codex reads the file past the mark (the `toml`
    crate's lexer skips one), so `[features] hooks = true` and `[mcp_servers.relay]`, written
    after it, take effect. A client version that stops reading such a file fails here."""
    api = FakeModelApi()
    client = CodexClient(api)
    try:
        home = tmp_path / "home"
        (home / "work").mkdir(parents=True)
        config = home / ".codex/config.toml"
        config.parent.mkdir()
        config.write_text("")
        client.prepare(home)  # the fake model's provider: the user's own settings, before install
        config.write_bytes(json_text.BOM.encode() + config.read_bytes())
        done = relay(
            home, "install", "--url", server.url, "--key", server.admin_key, "--agent", "codex"
        )
        assert done.returncode == 0, done.stderr
        assert config.read_bytes().startswith(json_text.BOM.encode() + b'model = "fake"\n')
        listed = client.mcp_list(home)
        assert listed.returncode == 0, listed.stderr
        assert re.search(r"^relay\s+\S*/relay\s+mcp\s+.*enabled", listed.stdout, flags=re.M)
        turn = client.run(home, "config_bom", NEEDED)
    finally:
        api.close()
    carried = count_in(prompt_call(client, turn).body, "<relay-memory")
    assert carried >= 1 and "hit" in [o.get("outcome") for o in turn.outcomes], turn.describe()


# -- MCP: listed by the client, answers a tool call from the model --------------------------------
@pytest.mark.parametrize("config_at", ["default", "RELAY_CONFIG"])
@pytest.mark.parametrize("client_name", ["claude-code", "codex"])
def test_the_installed_mcp_server_is_listed_and_answers_a_tool_call(
    client_name, config_at, server, tmp_path
):
    # RELAY_CONFIG: install, and then the agent, run in a shell that sets it, so the config
    # is written there. Codex starts MCP servers with only a few of its variables: its
    # `relay mcp` read ~/.relay/config.json, absent, and every call failed "no server URL".
    relay_env = {"RELAY_CONFIG": str(tmp_path / "elsewhere.json")} if config_at != "default" else {}
    api = FakeModelApi()
    client = CLIENTS[client_name](api)
    try:
        home = make_home(tmp_path, client, server.url, server.admin_key, **relay_env)
        listed = client.mcp_list(home)
        assert listed.returncode == 0, listed.stderr
        out = listed.stdout
        if isinstance(client, ClaudeClient):
            assert re.search(r"^relay: .*relay mcp - .*Connected", out, flags=re.M), out
        else:
            assert re.search(r"^relay\s+\S*/relay\s+mcp\s+.*enabled", out, flags=re.M), out

        results: list[str] = []

        def respond(rec: Recorded) -> Reply | None:
            body = rec.body
            if isinstance(client, ClaudeClient):
                last = body["messages"][-1]["content"]
                outputs = [
                    b for b in last if isinstance(b, dict) and b.get("type") == "tool_result"
                ]
                names = [t.get("name") for t in body.get("tools", [])]
                call = Reply(tool="mcp__relay__team_memory_search", arguments={"query": NEEDED})
                ready = "mcp__relay__team_memory_search" in names
            else:
                last = body["input"][-1]
                outputs = [last] if last.get("type") == "function_call_output" else []
                spaces = {
                    t.get("name"): t for t in body.get("tools", []) if t.get("type") == "namespace"
                }
                tools = [t.get("name") for t in spaces.get("mcp__relay", {}).get("tools", [])]
                call = Reply(
                    tool="team_memory_search", namespace="mcp__relay", arguments={"query": NEEDED}
                )
                ready = "team_memory_search" in tools
            if outputs:
                results.append(json.dumps(outputs))
                return Reply(text="done")
            return call if ready else Reply(text="the relay tools are missing")

        api.respond = respond
        if isinstance(client, ClaudeClient):
            # Connect MCP servers before the first request (by default they connect in the
            # background and the first turn may not list them); allow the one read-only tool.
            env = {"MCP_CONNECTION_NONBLOCKING": "0", **relay_env}
            args = ("--allowedTools", "mcp__relay__team_memory_search")
        else:
            env = relay_env
            args = ("-c", "mcp_servers.relay.required=true")  # wait for it, as above
        turn = client.run(
            home, "mcp", "search team memory for the staging cluster", env=env, args=args
        )
    finally:
        api.close()
    assert turn.run.returncode == 0, turn.describe()
    assert len(results) == 1, f"no tool result came back to the model\n{turn.describe()}"
    text = "\n".join(strings(json.loads(results[0])))
    assert memory_tag(server.clusters) in text and 'source="team/infra"' in text, text[:1000]
    assert CLUSTERS in text, text[:1000]
