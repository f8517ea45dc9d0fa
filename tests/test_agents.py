"""The settings edits behind `relay install`, one content at a time (no processes)."""

from __future__ import annotations

import tomllib

import pytest

from relay import agents

SCRIPT = "/home/me/.relay/relay-autosearch-hook.sh"
RELAY = "/opt/relay/.venv/bin/relay"


def test_hook_commands_guard_the_script_and_exec_it():
    prompt = agents.hook_command(SCRIPT, "UserPromptSubmit")
    start = agents.hook_command(SCRIPT, "SessionStart")
    assert prompt == f"[ -x {SCRIPT} ] && exec {SCRIPT} || exit 0"
    assert start == f"[ -x {SCRIPT} ] && exec {SCRIPT} session-start || exit 0"
    spaced = agents.hook_command("/home/a b/.relay/relay-autosearch-hook.sh", "UserPromptSubmit")
    assert spaced.startswith("[ -x '/home/a b/.relay/relay-autosearch-hook.sh' ]")
    shared = agents.hook_command('"$HOME/.relay/relay-autosearch-hook.sh"', "UserPromptSubmit")
    assert shared.startswith('[ -x "$HOME/.relay/relay-autosearch-hook.sh" ] && exec "$HOME')


def test_add_then_strip_hooks_round_trips_and_never_duplicates():
    doc = {
        "hooks": {
            "UserPromptSubmit": [{"hooks": [{"type": "command", "command": "other"}]}],
            "Stop": [{"hooks": [{"type": "command", "command": "bye"}]}],
        },
        "model": "opus",
    }
    once = agents.add_hooks(doc, SCRIPT)
    twice = agents.add_hooks(once, SCRIPT)
    assert once == twice
    assert agents.relay_hook_commands(once) == {
        "UserPromptSubmit": [agents.hook_command(SCRIPT, "UserPromptSubmit")],
        "SessionStart": [agents.hook_command(SCRIPT, "SessionStart")],
    }
    assert agents.strip_hooks(twice) == doc
    assert agents.strip_hooks(agents.add_hooks({}, SCRIPT)) == {}
    # an existing empty `hooks` means the same as none
    assert agents.normalise_hooks(agents.strip_hooks(agents.add_hooks({"hooks": {}}, SCRIPT))) == {}


def test_a_relay_handler_sharing_a_group_keeps_its_neighbours():
    mine = {"type": "command", "command": f"{SCRIPT} --old"}
    doc = {"hooks": {"UserPromptSubmit": [{"hooks": [{"type": "command", "command": "x"}, mine]}]}}
    assert agents.strip_hooks(doc) == {
        "hooks": {"UserPromptSubmit": [{"hooks": [{"type": "command", "command": "x"}]}]}
    }


@pytest.mark.parametrize("bad", [{"hooks": []}, {"hooks": {"SessionStart": {"hooks": []}}}])
def test_malformed_hooks_are_refused(bad):
    with pytest.raises(agents.SettingsFileError):
        agents.add_hooks(bad, SCRIPT, "settings.json")


@pytest.mark.parametrize(
    "doc",
    [
        {"hooks": None},
        {"hooks": {"UserPromptSubmit": None, "SessionStart": [{"hooks": None}]}},
    ],
)
def test_null_where_hooks_go_is_none_registered(doc):
    """QA: valid JSON with null there crashed relay install with a traceback."""
    added = agents.add_hooks(doc, SCRIPT, "settings.json")
    assert {h.event for h in agents.relay_handlers(added)} == set(agents.EVENTS)
    assert len(agents.relay_handlers(agents.add_hooks(added, SCRIPT, "settings.json"))) == 2


def test_null_mcp_servers_is_none_registered():
    added, note = agents.add_mcp_server({"mcpServers": None}, RELAY, "~/.claude.json")
    assert note == "" and added["mcpServers"]["relay"]["command"] == RELAY


def test_mcp_server_entry_added_replaced_and_removed():
    doc = {"mcpServers": {"docs": {"command": "d"}}, "numStartups": 3}
    added, note = agents.add_mcp_server(doc, RELAY, "~/.claude.json")
    assert note == "" and added["mcpServers"]["relay"]["command"] == RELAY
    moved, _ = agents.add_mcp_server(added, "/new/venv/bin/relay", "~/.claude.json")
    assert moved["mcpServers"]["relay"]["command"] == "/new/venv/bin/relay"
    assert agents.strip_mcp_server(moved, doc) == doc
    assert agents.strip_mcp_server(agents.add_mcp_server({}, RELAY, "x")[0], {}) == {}
    foreign = {"mcpServers": {"relay": {"command": "npx", "args": ["some-relay"]}}}
    kept, note = agents.add_mcp_server(foreign, RELAY, "~/.claude.json")
    assert kept == foreign and "left mcpServers.relay" in note


CODEX_CASES = {
    "empty": "",
    "no features": 'model = "o3"\n',
    "features table": '[features]\nweb_search = true # on\n\n[profiles.x]\nmodel = "y"\n',
    "features header with comment": "[ features ]  # flags\nfoo = 1",
    "legacy flag on": "[features]\ncodex_hooks = true\n",
    "features header last, no newline": 'model = "o3"\n[features]',
    "CRLF line endings": "[features]\r\nweb_search = true # on\r\n\r\n[x]\r\ny = 1\r\n",
}


@pytest.mark.parametrize("text", CODEX_CASES.values(), ids=CODEX_CASES.keys())
def test_codex_config_edit_is_valid_minimal_and_reversible(text):
    new, notes = agents.add_codex_config(text, RELAY, "config.toml")
    data = tomllib.loads(new)
    features = data["features"]
    assert features.get("hooks", features.get("codex_hooks")) is True
    assert data["mcp_servers"]["relay"] == agents.codex_mcp_entry(RELAY)
    assert notes == []
    again, _ = agents.add_codex_config(new, RELAY, "config.toml")
    assert again == new
    assert tomllib.loads(agents.strip_codex_config(new)) == tomllib.loads(text)
    kept = [line for line in text.splitlines() if line.strip()]
    assert all(line in new.splitlines() for line in kept)  # nothing the user wrote is rewritten


def test_a_crlf_config_gets_crlf_lines_and_strips_back_to_its_bytes():
    # A config.toml saved on Windows: its [features] header ends in "\r\n". The header went
    # unrecognised, so the hooks flag was never set, and install's note said [features]
    # was "in a form relay install does not edit".
    text = "# mine\r\n[features]\r\nweb_search = true\r\n"
    new, notes = agents.add_codex_config(text, RELAY, "config.toml")
    assert notes == []
    assert tomllib.loads(new)["features"] == {"hooks": True, "web_search": True}
    assert "\n" not in new.replace("\r\n", "")  # every line Relay adds ends as the file's do
    assert agents.strip_codex_config(new) == text


def test_a_features_line_inside_a_multiline_string_is_not_the_header():
    # QA: install wrote its flag under the first line reading `[features]`, here a line of
    # the user's developer_instructions: the text gained a line and Codex hooks stayed off.
    text = 'developer_instructions = """\nConfig notes:\n[features]\nis where flags go\n"""\n'
    new, notes = agents.add_codex_config(text, RELAY, "config.toml")
    data = tomllib.loads(new)
    assert data["developer_instructions"] == tomllib.loads(text)["developer_instructions"]
    assert data["features"] == {"hooks": True} and notes == []
    assert agents.strip_codex_config(new) == text
    # Under a real [features] table after such a string, the flag goes under the real header.
    theirs = text + "\n[features]\nweb_search = true\n"
    new, notes = agents.add_codex_config(theirs, RELAY, "config.toml")
    data = tomllib.loads(new)
    assert data["developer_instructions"] == tomllib.loads(text)["developer_instructions"]
    assert data["features"] == {"hooks": True, "web_search": True} and notes == []
    assert new.count("[features]") == 2 and agents.strip_codex_config(new) == theirs


def test_a_block_whose_end_marker_was_deleted_takes_none_of_the_users_tables():
    # The user deleted `# <<< relay` (a comment, to them) and added a server below the block:
    # uninstall, and re-install, dropped every line after the block's first.
    installed, _ = agents.add_codex_config('model = "o3"\n', RELAY, "config.toml")
    theirs = '\n[mcp_servers.linear]\nurl = "https://mcp.linear.app/mcp"\n'
    edited = installed.replace(agents.TOML_END + "\n", "") + theirs
    assert agents.strip_codex_config(edited) == 'model = "o3"\n' + theirs
    again, _ = agents.add_codex_config(edited, RELAY, "config.toml")
    assert tomllib.loads(again)["mcp_servers"]["linear"] == {"url": "https://mcp.linear.app/mcp"}


def test_codex_config_respects_what_it_should_not_touch():
    off, notes = agents.add_codex_config("[features]\nhooks = false\n", RELAY, "c")
    assert tomllib.loads(off)["features"]["hooks"] is False and "turned off" in notes[0]
    inline, notes = agents.add_codex_config("features = { web_search = true }\n", RELAY, "c")
    assert "hooks" not in tomllib.loads(inline)["features"] and "does not edit" in notes[0]
    theirs = '[mcp_servers.relay]\ncommand = "relay-proxy"\n'
    same, notes = agents.add_codex_config(theirs, RELAY, "c")
    assert tomllib.loads(same)["mcp_servers"]["relay"] == {"command": "relay-proxy"}
    assert "left [mcp_servers.relay]" in notes[0]
    with pytest.raises(agents.SettingsFileError, match="not valid TOML"):
        agents.add_codex_config("[features\n", RELAY, "config.toml")
    # QA: a valid file with its servers on one line was refused as "not valid TOML" (no table
    # can extend an inline one), and the whole install with it.
    inline_servers = 'mcp_servers = { docs = { command = "docs-mcp" } }\n'
    new, notes = agents.add_codex_config(inline_servers, RELAY, "c")
    assert tomllib.loads(new) == {
        "mcp_servers": {"docs": {"command": "docs-mcp"}},
        "features": {"hooks": True},
    }
    assert notes == [
        "config.toml defines mcp_servers as an inline table, which relay install does not edit;"
        f' add relay = {{ command = "{RELAY}", args = ["mcp"] }} to it for explicit recall'
    ]
    assert agents.strip_codex_config(new) == inline_servers


def test_paths_with_quotes_and_unicode_stay_valid_toml():
    odd = '/home/zoë/"venv"\\bin/relay'
    new, _ = agents.add_codex_config("", odd, "c")
    assert tomllib.loads(new)["mcp_servers"]["relay"]["command"] == odd


HOOK = "/opt/relay/.venv/bin/relay-hook"
BY_HAND = {  # as docs/hook.md shows: relay-hook itself, no knob script
    "hooks": {
        "UserPromptSubmit": [{"hooks": [{"type": "command", "command": HOOK}]}],
        "SessionStart": [{"hooks": [{"type": "command", "command": f"{HOOK} session-start"}]}],
    }
}


def test_a_hook_registered_by_hand_is_relays_and_install_replaces_it():
    """QA: a `relay-hook` registered by hand was not Relay's to install, which added a
    second pair (the hook ran twice per prompt), nor to doctor, which saw no hooks."""
    assert agents.relay_hook_commands(BY_HAND) == {
        "UserPromptSubmit": [HOOK],
        "SessionStart": [f"{HOOK} session-start"],
    }
    assert agents.relay_hook_commands(agents.add_hooks(BY_HAND, SCRIPT)) == {
        "UserPromptSubmit": [agents.hook_command(SCRIPT, "UserPromptSubmit")],
        "SessionStart": [agents.hook_command(SCRIPT, "SessionStart")],
    }
    assert agents.strip_hooks(BY_HAND) == {}


@pytest.mark.parametrize(
    ("command", "started"),
    [
        (agents.hook_command(SCRIPT, "SessionStart"), (SCRIPT, ["session-start"])),
        (
            agents.hook_command('"$HOME/.relay/relay-autosearch-hook.sh"', "UserPromptSubmit"),
            ("$HOME/.relay/relay-autosearch-hook.sh", []),
        ),
        (HOOK, (HOOK, [])),
        (f"RELAY_DEADLINE_MS=800 exec {HOOK} session-start 2>/dev/null", (HOOK, ["session-start"])),
        (f"cd /tmp && {HOOK}; true", (HOOK, [])),
        ("relay-hook", ("relay-hook", [])),
    ],
)
def test_what_a_relay_command_starts(command, started):
    assert agents.is_relay_handler({"type": "command", "command": command})
    assert agents.started_in_command(command) == started


@pytest.mark.parametrize(
    "command", ["echo relay-hooks", "/usr/bin/my-relay-hook", "relay hook", "python3 -m other"]
)
def test_commands_that_are_not_relays(command):
    assert not agents.is_relay_handler({"type": "command", "command": command})


@pytest.mark.parametrize(
    ("matcher", "matched"),
    [
        (None, {"startup", "resume", "clear", "compact"}),
        ("", {"startup", "resume", "clear", "compact"}),
        ("*", {"startup", "resume", "clear", "compact"}),
        ("compact", {"compact"}),
        ("startup|clear", {"startup", "clear"}),
        ("^(startup|resume)$", {"startup", "resume"}),
        ("c.*", {"clear", "compact"}),
        ("[", set()),  # not a regular expression: matches nothing
        (3, set()),
    ],
)
def test_session_start_matchers(matcher, matched):
    sources = agents.SESSION_SOURCES["claude-code"]
    assert {s for s in sources if agents.matcher_matches(matcher, s)} == matched


def test_a_relay_mcp_entry_with_edited_args_is_still_relays():
    """Its `args` edited away from ["mcp"], Relay's entry is still Relay's: install rewrites
    it instead of leaving it broken, uninstall removes it."""
    broken = {"mcpServers": {"relay": {"type": "stdio", "command": RELAY, "args": ["mcpp"]}}}
    repaired, note = agents.add_mcp_server(broken, RELAY, "~/.claude.json")
    assert note == "" and repaired["mcpServers"]["relay"]["args"] == ["mcp"]
    assert agents.runs_relay_mcp(repaired["mcpServers"]["relay"])
    assert not agents.runs_relay_mcp(broken["mcpServers"]["relay"])
    assert agents.strip_mcp_server(broken, {}) == {}
