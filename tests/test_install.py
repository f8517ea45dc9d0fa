"""`relay install` / `relay uninstall` in temporary HOMEs against a real `relay serve`, then
the exact command written into the agents' settings, run with realistic stdin."""

from __future__ import annotations

import contextlib
import difflib
import errno
import json
import os
import shutil
import stat
import statistics
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
from integration_support import (
    BIN,
    RELAY,
    clean_env,
    immutable,
    mint,
    old_script,
    registered_command,
    relay,
    remember,
    run_registered,
    snapshot,
    start_module_server,
    stop_server,
    web_server,
)

MIGRATIONS = (
    "Database migrations: create them with `make migration name=...` and apply them with "
    "`make migrate`; never edit a migration that has already been applied on staging."
)
EXISTING_SETTINGS = """{
    "model": "opus",
    "permissions": {"allow": ["Bash(npm test:*)"], "deny": []},
    "env": {"FOO": "bar"}
}
"""
HOOK_LADEN_SETTINGS = """{
  "hooks": {
    "UserPromptSubmit": [
      {"hooks": [{"type": "command", "command": "~/bin/prompt-guard", "timeout": 10}]}
    ],
    "SessionStart": [
      {"matcher": "startup", "hooks": [{"type": "command", "command": "cat ~/notes.md"}]}
    ],
    "PreToolUse": [
      {"matcher": "Bash", "hooks": [{"type": "command", "command": "~/bin/check-bash"}]}
    ]
  },
  "statusLine": {"type": "command", "command": "git branch --show-current"}
}
"""
EXISTING_CODEX_CONFIG = """# my codex config
model = "o3"
approval_policy = "on-request"

[features]
web_search_request = true   # keep me

[mcp_servers.docs]
command = "docs-mcp"
args = ["--stdio"]

[projects."/home/me/repo"]
trust_level = "trusted"
"""
CODEX_HOOKS = """{"hooks": {
 "Stop": [{"hooks": [{"type": "command", "command": "notify-send done"}]}],
 "UserPromptSubmit": [{"hooks": [{"type": "command", "command": "log-prompt"}]}]}}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    live = start_module_server(tmp_path_factory, "install")
    admin = live.admin_key
    remember(live.url, admin, body=MIGRATIONS, title="Migrations", source="team/db/migrations")
    remember(
        live.url,
        admin,
        body="Code review: every change needs an approving review by the owning team.",
        title="Reviews",
        source="team/process/reviews",
        pinned=True,
    )
    writer = mint(live.url, admin, "install-tests", ["memory:read", "memory:write"])
    yield {"url": live.url, "admin": admin, "key": writer["secret"], "server": live}
    stop_server(live)


# The knobs the hook script hands the hook, beating config.json's values.
SCRIPT_KNOBS = ("deadline_ms", "min_prompt_len", "throttle_prompts", "overlap_threshold")


def install(home: Path, server: dict, *args: str):
    return relay(home, "install", "--url", server["url"], "--key", server["key"], *args)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def relay_entries(path: Path) -> dict[str, int]:
    doc = json.loads(path.read_text())
    return {
        event: sum(
            "relay-autosearch-hook.sh" in h["command"] for g in groups for h in g.get("hooks", [])
        )
        for event, groups in doc.get("hooks", {}).items()
    }


def without_relay(path: Path) -> dict:
    doc = json.loads(path.read_text())
    for event in list(doc.get("hooks", {})):
        groups = [
            g
            for g in doc["hooks"][event]
            if not any("relay-autosearch-hook.sh" in h["command"] for h in g["hooks"])
        ]
        if groups:
            doc["hooks"][event] = groups
        else:
            del doc["hooks"][event]
    if doc.get("hooks") == {}:
        del doc["hooks"]
    return doc


# -- into empty, existing, hook-laden and invalid settings ----------------------------------
def test_install_into_an_empty_home_then_uninstall_leaves_it_empty(tmp_path, server):
    home = tmp_path
    done = install(home, server)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for name in (
        "~/.relay/key",
        "~/.relay/config.json",
        "~/.relay/relay-autosearch-hook.sh",
        "~/.claude/settings.json",
        "~/.claude.json",
        "~/.codex/hooks.json",
        "~/.codex/config.toml",
    ):
        assert f"created    {name}" in out, out
    assert "/hooks" in out and "trust" in out  # Codex trust instructions

    key = home / ".relay/key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert key.read_text().strip() == server["key"]
    assert stat.S_IMODE((home / ".relay").stat().st_mode) == 0o700
    config = json.loads((home / ".relay/config.json").read_text())
    assert config["url"] == server["url"] and config["api_key_file"] == str(key)
    assert "api_key" not in config
    assert config["max_records"] == 3 and config["breaker_failures"] == 3
    assert not set(config) & set(SCRIPT_KNOBS)  # the script's, which would beat them

    script = home / ".relay/relay-autosearch-hook.sh"
    text = script.read_text()
    assert os.access(script, os.X_OK)
    for knob in (
        "THROTTLE_PROMPTS=2",
        "OVERLAP_THRESHOLD=0.30",
        "MIN_PROMPT_LEN=15",
        "DEADLINE_MS=400",
    ):
        line = text.splitlines().index(knob)
        assert text.splitlines()[line - 1].startswith("# ")  # a one-line comment above each
    assert f'exec {BIN / "relay-hook"} "$@"' in text

    for settings in (home / ".claude/settings.json", home / ".codex/hooks.json"):
        doc = json.loads(settings.read_text())
        assert relay_entries(settings) == {"UserPromptSubmit": 1, "SessionStart": 1}
        for event in ("UserPromptSubmit", "SessionStart"):
            (group,) = doc["hooks"][event]
            assert "matcher" not in group  # every prompt, every session source
            (handler,) = group["hooks"]
            assert handler["type"] == "command" and 1 <= handler["timeout"] <= 10
            assert str(script) in handler["command"]
    mcp = json.loads((home / ".claude.json").read_text())["mcpServers"]["relay"]
    assert mcp == {"type": "stdio", "command": str(BIN / "relay"), "args": ["mcp"], "env": {}}
    codex = tomllib.loads((home / ".codex/config.toml").read_text())
    assert codex["features"]["hooks"] is True
    assert codex["mcp_servers"]["relay"] == {
        "command": str(BIN / "relay"),
        "args": ["mcp"],
        # Codex hands an MCP server only these of its variables (and HOME, PATH, ...)
        "env_vars": ["RELAY_CONFIG", "RELAY_URL", "RELAY_API_KEY", "RELAY_API_KEY_FILE"],
    }

    undone = relay(home, "uninstall")
    assert undone.returncode == 0, undone.stderr
    assert snapshot(home) == {}
    assert list(home.iterdir()) == []


@pytest.mark.parametrize(
    "claude_settings,codex_hooks",
    [(EXISTING_SETTINGS, None), (HOOK_LADEN_SETTINGS, CODEX_HOOKS)],
    ids=["existing", "hook-laden"],
)
def test_install_preserves_existing_settings_and_uninstall_restores_them_byte_for_byte(
    tmp_path, server, claude_settings, codex_hooks
):
    home = tmp_path
    write(home / ".claude/settings.json", claude_settings)
    write(home / ".claude.json", '{"numStartups": 7, "mcpServers": {"docs": {"command": "d"}}}')
    write(home / ".codex/config.toml", EXISTING_CODEX_CONFIG)
    if codex_hooks:
        write(home / ".codex/hooks.json", codex_hooks)
    (home / ".claude/settings.json").chmod(0o640)
    before = snapshot(home)

    done = install(home, server)
    assert done.returncode == 0, done.stderr
    assert "updated    ~/.claude/settings.json" in done.stdout
    assert "backup ~/.relay/backups/settings.json." in done.stdout

    claude = home / ".claude/settings.json"
    assert stat.S_IMODE(claude.stat().st_mode) == 0o640  # permissions kept
    assert without_relay(claude) == json.loads(claude_settings)  # every other setting as it was
    assert relay_entries(claude)["UserPromptSubmit"] == 1
    doc = json.loads(claude.read_text())
    assert doc["hooks"]["UserPromptSubmit"][-1]["hooks"][0]["command"].endswith("|| exit 0")
    if codex_hooks:
        assert without_relay(home / ".codex/hooks.json") == json.loads(codex_hooks)
    claude_json = json.loads((home / ".claude.json").read_text())
    assert claude_json["numStartups"] == 7 and set(claude_json["mcpServers"]) == {"docs", "relay"}
    toml_text = (home / ".codex/config.toml").read_text()
    assert toml_text.startswith(EXISTING_CODEX_CONFIG.split("[features]")[0])  # untouched above
    codex = tomllib.loads(toml_text)
    assert codex["features"] == {"hooks": True, "web_search_request": True}
    assert codex["mcp_servers"]["docs"] == {"command": "docs-mcp", "args": ["--stdio"]}
    assert codex["projects"] == {"/home/me/repo": {"trust_level": "trusted"}}
    backups = list((home / ".relay/backups").iterdir())
    assert {b.read_bytes() for b in backups} >= {claude_settings.encode()}

    undone = relay(home, "uninstall")
    assert undone.returncode == 0, undone.stderr
    assert snapshot(home) == before


def test_uninstall_gives_relays_own_files_back_their_original_modes(tmp_path, server):
    """QA: uninstall restored a ~/.relay/config.json of the user's byte for byte, but its mode
    644 came back as the 600 install had forced; a script's 755 as 700."""
    home = tmp_path
    write(home / ".relay/config.json", '{"url": "http://old:8765", "max_records": 5}\n')
    write(home / ".relay/relay-autosearch-hook.sh", "#!/bin/sh\nexec my-hook\n")
    (home / ".relay").chmod(0o755)
    (home / ".relay/config.json").chmod(0o644)
    (home / ".relay/relay-autosearch-hook.sh").chmod(0o755)
    before = snapshot(home)
    assert install(home, server).returncode == 0
    assert stat.S_IMODE((home / ".relay/config.json").stat().st_mode) == 0o600
    done = relay(home, "uninstall")
    assert done.returncode == 0, done.stderr
    assert "  restored   ~/.relay/config.json  (without Relay config)\n" in done.stdout
    assert snapshot(home) == before  # bytes and modes


@pytest.mark.parametrize(
    ("name", "text", "what"),
    [
        ("config.json", '{"url": "http://old:8765", "api_key": "relay_old"}\n', " (api_key)"),
        ("key", "relay_old\n", ""),
    ],
)
def test_a_restored_file_holding_a_key_stays_600_and_uninstall_says_why(
    tmp_path, server, name, text, what
):
    home = tmp_path
    write(home / ".relay" / name, text)
    (home / ".relay" / name).chmod(0o644)
    assert install(home, server).returncode == 0
    done = relay(home, "uninstall")
    assert done.returncode == 0, done.stderr
    assert f"~/.relay/{name}  (without " in done.stdout
    assert f"; mode 600 kept, not the original's 644: it holds an API key{what})\n" in done.stdout
    assert (home / ".relay" / name).read_text() == text
    assert stat.S_IMODE((home / ".relay" / name).stat().st_mode) == 0o600


@pytest.mark.parametrize(
    "broken",
    [".claude/settings.json", ".codex/hooks.json", ".claude.json", ".codex/config.toml"],
)
def test_invalid_settings_file_is_refused_and_nothing_changes(tmp_path, server, broken):
    home = tmp_path
    write(home / ".claude/settings.json", EXISTING_SETTINGS)
    write(home / ".codex/config.toml", EXISTING_CODEX_CONFIG)
    bad = '{"hooks": {"UserPromptSubmit": [ }' if broken.endswith(".json") else "model = \n["
    write(home / broken, bad)
    before = snapshot(home)
    done = install(home, server)
    assert done.returncode != 0
    kind = "JSON" if broken.endswith(".json") else "TOML"
    assert f"is not valid {kind}" in done.stderr and "othing was changed" in done.stderr
    assert broken in done.stderr
    assert snapshot(home) == before


# What a refusal of Claude Code's settings.json adds when Codex is installed too: it need not wait.
CODEX_ALONE = ". To install for Codex alone meanwhile: relay install --agent codex"


@pytest.mark.parametrize("where", [".claude/settings.json", ".codex/hooks.json", ".claude.json"])
@pytest.mark.parametrize(
    ("number", "why"),
    [
        ("1e400", "past a double's range: read, it is infinity, which JSON cannot write back"),
        ("-1E+999", "past a double's range: read, it is infinity, which JSON cannot write back"),
        ("NaN", "no JSON number: the agents cannot read this file"),
        ("-Infinity", "no JSON number: the agents cannot read this file"),
    ],
)
def test_a_number_json_cannot_carry_is_refused_and_nothing_changes(
    tmp_path, server, where, number, why
):
    """QA: `{"env": {"N": 1e400}}` was rewritten as `"N": Infinity`, which Claude Code's
    JSON.parse cannot read: the whole user settings file was lost to it."""
    why = (
        f"{tmp_path / where} holds the number {number}, {why}; write it as a string or a finite"
        " number, then run relay install again. Nothing was changed"
    ) + (CODEX_ALONE if where == ".claude/settings.json" else "")
    number_in = f'{{"env": {{"N": {number}}}, '
    write(tmp_path / where, number_in[:-2] + "}")
    before = snapshot(tmp_path)
    done = install(tmp_path, server)
    assert (done.returncode, done.stderr) == (2, f"relay: error: {why}\n")
    assert snapshot(tmp_path) == before
    # Put there after an install: uninstall would have written it back as Infinity too.
    (tmp_path / where).unlink()
    assert install(tmp_path, server).returncode == 0
    path = tmp_path / where
    path.write_text(path.read_text().replace("{", number_in, 1))
    edited = path.read_bytes()
    before = snapshot(tmp_path)
    done = relay(tmp_path, "uninstall")  # stops before changing anything, and says so
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("relay: error: uninstall cannot take the ")
    why = why.removesuffix(CODEX_ALONE)  # install's hint alone
    assert done.stderr.endswith(
        f"so Relay is still wired in: {why.replace('relay install', 'relay uninstall')}\n"
    )
    assert path.read_bytes() == edited and snapshot(tmp_path) == before


# A settings.json as kept in a dotfiles repository: four spaces, one-line objects, an
# escape, a number written 1.50, no newline at the end.
DOTFILES_SETTINGS = """{
    "$schema": "https://json.schemastore.org/claude-code-settings.json",
    "model": "opus",
    "permissions": {"allow": ["Bash(npm test:*)", "Read(~/café/**)"], "deny": []},
    "env": {"GREETING": "h\\u00e9llo", "RATIO": 1.50},
    "hooks": {
        "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "check"}]}]
    }
}"""


@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_install_adds_its_lines_to_a_settings_file_and_leaves_every_other_as_written(
    tmp_path, server, newline
):
    """QA: install rewrote all of settings.json (one-line objects spread over lines, the
    escape decoded, 1.50 as 1.5, a newline added at the end): a dotfiles repository's
    diff showed the whole file changed. Uninstall then takes out exactly Relay's lines,
    keeping an edit made since, and an untouched file comes back byte for byte."""
    home = tmp_path
    original = DOTFILES_SETTINGS.replace("\n", newline)
    claude, codex = home / ".claude/settings.json", home / ".codex/hooks.json"
    for path in (claude, codex):
        path.parent.mkdir(parents=True)
        path.write_bytes(original.encode())
    assert install(home, server).returncode == 0
    for path in (claude, codex):
        after = path.read_bytes().decode()
        assert without_relay(path) == json.loads(original)
        lines = after.split(newline)
        assert "\n" not in "".join(lines)  # every line ends as the file's lines did
        old_lines = original.split(newline)
        changed = [line for line in difflib.ndiff(old_lines, lines) if line[0] in "-+"]
        pre_tool_use = old_lines[6]
        # The one line of the user's that changes gains the comma before Relay's entries.
        assert changed[:2] == [f"- {pre_tool_use}", f"+ {pre_tool_use},"]
        added = changed[2:]
        assert all(line.startswith("+ ") for line in added) and len(added) == 22
        assert added[0] == '+         "UserPromptSubmit": ['  # indented as its neighbours
        assert after.endswith("    }" + newline + "}")  # no newline added at the end

    claude.write_bytes(claude.read_bytes().replace(b'"opus"', b'"sonnet"'))
    done = relay(home, "uninstall")
    assert done.returncode == 0, done.stderr
    assert claude.read_bytes() == original.replace('"opus"', '"sonnet"').encode()
    assert codex.read_bytes() == original.encode()


@pytest.mark.parametrize("where", [".claude/settings.json", ".codex/hooks.json", ".claude.json"])
def test_settings_with_comments_are_refused_saying_which_lines_and_what_to_do(
    tmp_path, server, where
):
    """QA: a settings.json with a `//` comment was refused as "not valid JSON (Expecting
    property name enclosed in double quotes: line 2 column 5)". Claude Code refuses the
    same file whole ("Invalid or malformed JSON"), so Relay's hooks could not run from it
    either: install says what JSON lacks, on which lines, and what to take out."""
    home = tmp_path
    path = home / where
    jsonc = '{\n    // pinned for the team\n    "model": "opus",\n    "env": {"A": "1",},\n}\n'
    write(path, jsonc)
    before = snapshot(home)
    done = install(home, server)
    assert done.returncode == 2
    assert done.stderr == (
        f"relay: error: {path} holds a comment (line 2) and commas before closing brackets"
        " (line 4), which JSON does not allow: the agents and Relay's hook read their"
        " files as JSON, and skip all of one that has them. Take out the comment and those"
        " commas, then run relay install again. Nothing was changed"
        + (CODEX_ALONE if where == ".claude/settings.json" else "")
        + "\n"
    )
    assert snapshot(home) == before
    write(path, '{\n    "model": "opus" /* pinned */\n}\n')
    said = install(home, server).stderr
    assert (
        f"{path} holds a comment (line 2), which JSON" in said and "Take out the comment," in said
    )
    write(path, '{\n    "model": "opus",\n    "env": {"A": "1"}\n}\n')
    assert install(home, server).returncode == 0

    # Uninstall reads it alike: a comment added since stops it, saying the same.
    write(path, path.read_text().replace('"opus",', '"opus", // pinned'))
    undone = relay(home, "uninstall")
    assert undone.returncode == 2
    assert f"{path} holds a comment (line 2), which JSON does not allow" in undone.stderr
    assert "then run relay uninstall again. Nothing was changed" in undone.stderr


@pytest.mark.parametrize("where", [".claude/settings.json", ".claude.json"])
def test_a_claude_file_starting_with_a_bom_is_edited_and_keeps_it(tmp_path, server, where):
    """QA: a settings.json saved as "UTF-8 with BOM" was refused in Python's words ("Unexpected
    UTF-8 BOM (decode using utf-8-sig)"). Claude Code reads past a BOM and runs the hooks
    (tests/test_real_clients.py): install edits the file and keeps the BOM, and so does
    uninstall."""
    path = tmp_path / where
    path.parent.mkdir(parents=True, exist_ok=True)
    original = b'\xef\xbb\xbf{\n  "model": "opus"\n}\n'
    path.write_bytes(original)
    done = install(tmp_path, server, "--agent", "claude-code")
    assert done.returncode == 0, done.stderr
    written = path.read_bytes()
    assert written.startswith(b'\xef\xbb\xbf{\n  "model": "opus",\n')
    doc = json.loads(written[3:])  # Relay's entries written, after the BOM
    assert (
        "UserPromptSubmit" in doc["hooks"]
        if where.endswith("settings.json")
        else doc["mcpServers"]["relay"]
    )
    checked = relay(tmp_path, "doctor")  # it said "not valid JSON (Unexpected UTF-8 BOM ..."
    assert "JSON" not in checked.stdout + checked.stderr, checked.stdout
    undone = relay(tmp_path, "uninstall")
    assert undone.returncode == 0, undone.stderr
    assert path.read_bytes() == original


def test_a_codex_hooks_file_starting_with_a_bom_is_refused_saying_to_save_without_it(
    tmp_path, server
):
    """Codex runs none of the hooks of a hooks.json that starts with a BOM (pinned in
    tests/test_real_clients.py): install says so and what to do, not Python's "decode using
    utf-8-sig", and `relay doctor` names it."""
    path = tmp_path / ".codex/hooks.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(b'\xef\xbb\xbf{"hooks": {}}\n')
    before = snapshot(tmp_path)
    done = install(tmp_path, server, "--agent", "codex")
    assert done.returncode == 2
    assert done.stderr == (
        f"relay: error: {path} starts with a UTF-8 byte order mark (BOM), and Codex runs none"
        " of the hooks of such a file, Relay's included. Save it as UTF-8 without a BOM, then"
        " run relay install again. Nothing was changed\n"
    )
    assert snapshot(tmp_path) == before
    path.write_bytes(b'{"hooks": {}}\n')
    assert install(tmp_path, server, "--agent", "codex").returncode == 0
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    checked = relay(tmp_path, "doctor")
    assert f"{path} starts with a UTF-8 byte order mark (BOM), and Codex runs none" in (
        checked.stdout + checked.stderr
    )


@pytest.mark.parametrize(
    "original",
    [
        '[features]\nweb_search = true\n\n[tui]\ntheme = "dark"\n',  # the header on the mark's line
        'model = "gpt-5"\n',
        "",  # the mark alone
    ],
)
def test_a_codex_config_starting_with_a_bom_is_edited_and_keeps_it(tmp_path, server, original):
    """QA: a ~/.codex/config.toml saved as "UTF-8 with BOM" (Notepad, PowerShell) was refused
    with tomllib's bare "not valid TOML (Invalid statement (at line 1, column 1))". Codex reads
    it (the `toml` crate skips one leading mark; tests/test_real_clients.py runs its hooks), so
    install edits it as it edits any config.toml, the mark kept in front, and doctor and
    uninstall read it alike: uninstall gives back the original bytes."""
    path = tmp_path / ".codex/config.toml"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\xef\xbb\xbf" + original.encode())
    done = install(tmp_path, server, "--agent", "codex")
    assert done.returncode == 0, done.stderr
    assert "form relay install does not edit" not in done.stdout, done.stdout
    written = path.read_bytes()
    assert written.startswith(b"\xef\xbb\xbf" + original.split("\n")[0].encode())
    assert written.count(b"\xef\xbb\xbf") == 1
    doc = tomllib.loads(written[3:].decode())
    assert doc["features"]["hooks"] is True and doc["mcp_servers"]["relay"]["args"] == ["mcp"]
    if original.startswith("[features]"):  # the flag goes under the user's own header
        assert written.startswith(b"\xef\xbb\xbf[features]\nhooks = true  # added by relay")
    checked = relay(tmp_path, "doctor")
    assert "TOML" not in checked.stdout + checked.stderr, checked.stdout
    undone = relay(tmp_path, "uninstall")
    assert undone.returncode == 0, undone.stderr
    assert path.read_bytes() == b"\xef\xbb\xbf" + original.encode()


def test_settings_holding_lone_surrogates_and_line_separators_are_kept(tmp_path, server):
    """QA: a valid `"L": "\\ud800"` in settings.json ended install in a traceback
    (UnicodeEncodeError): it has no UTF-8, so it stays the escape it was."""
    settings = '{"env": {"L": "\\ud800", "\\udc00key": "x\u2028    y"},\n\t"model": "opus"\n}\n'
    for where in (".claude/settings.json", ".codex/hooks.json"):
        write(tmp_path / where, settings)
    before = snapshot(tmp_path)
    done = install(tmp_path, server)
    assert done.returncode == 0, done.stderr
    for where in (".claude/settings.json", ".codex/hooks.json"):
        text = (tmp_path / where).read_text(encoding="utf-8")
        assert text.startswith(settings[: settings.index('"opus"')])  # as it was written
        assert without_relay(tmp_path / where) == json.loads(settings)
    assert relay(tmp_path, "uninstall").returncode == 0
    assert snapshot(tmp_path) == before


def test_null_where_relay_registers_is_nothing_registered(tmp_path, server):
    """QA: valid JSON with null for hooks or mcpServers crashed install with a traceback."""
    home = tmp_path
    write(home / ".claude/settings.json", '{"hooks": null}')
    write(home / ".claude.json", '{"mcpServers": null, "numStartups": 2}')
    write(home / ".codex/hooks.json", '{"hooks": {"UserPromptSubmit": null}}')
    before = snapshot(home)
    done = install(home, server)
    assert done.returncode == 0, done.stderr
    assert relay_entries(home / ".claude/settings.json")["UserPromptSubmit"] == 1
    assert relay_entries(home / ".codex/hooks.json")["SessionStart"] == 1
    assert "relay" in json.loads((home / ".claude.json").read_text())["mcpServers"]
    assert relay(home, "uninstall").returncode == 0
    assert snapshot(home) == before


def test_settings_whose_hooks_are_the_wrong_shape_are_refused(tmp_path, server):
    write(tmp_path / ".claude/settings.json", '{"hooks": ["not", "an", "object"]}')
    before = snapshot(tmp_path)
    done = install(tmp_path, server)
    assert done.returncode != 0 and "'hooks' is not an object" in done.stderr
    assert snapshot(tmp_path) == before


def test_a_bad_key_or_a_dead_server_writes_nothing(tmp_path, server):
    write(tmp_path / ".claude/settings.json", EXISTING_SETTINGS)
    before = snapshot(tmp_path)
    bad_key = relay(tmp_path, "install", "--url", server["url"], "--key", "relay_abc_" + "x" * 32)
    assert bad_key.returncode == 3 and "invalid API key" in bad_key.stderr
    # QA: the line named neither the server nor where a key it takes comes from.
    assert f"the server at {server['url']} refused the key" in bad_key.stderr
    assert "relay key create" in bad_key.stderr
    dead = relay(tmp_path, "install", "--url", "http://127.0.0.1:9", "--key", server["key"])
    assert dead.returncode != 0 and "cannot reach the Relay server" in dead.stderr
    assert snapshot(tmp_path) == before


def test_a_url_that_is_not_a_relay_root_says_what_to_give(tmp_path, server):
    """QA: `--url http://host:port/v1` failed with just `relay: error: Not Found`; another
    web server answering 200 with HTML failed with a JSON traceback."""
    home = tmp_path / "home"
    home.mkdir()
    with_v1 = relay(home, "install", "--url", server["url"] + "/v1", "--key", server["key"])
    assert with_v1.returncode == 2 and with_v1.stderr.count("\n") == 1, with_v1.stderr
    assert with_v1.stderr.startswith(f"relay: error: {server['url']}/v1 is not a Relay server root")
    assert f"give its root, {server['url']}, without /v1" in with_v1.stderr
    site = tmp_path / "site"
    write(site / "v1/whoami", "<html>welcome</html>")
    with web_server(site) as other:
        elsewhere = relay(home, "install", "--url", other, "--key", server["key"])
    assert elsewhere.returncode == 2 and "Traceback" not in elsewhere.stderr
    assert f"{other} is not a Relay server root" in elsewhere.stderr
    assert "got an answer that is not JSON" in elsewhere.stderr
    assert snapshot(home) == {}


def test_key_file_mistakes_are_one_line_errors(tmp_path, server):
    """QA: an empty --key-file fell through to an `API key:` prompt, then `aborted`; --key
    with --key-file silently used the file."""
    home = tmp_path / "home"
    home.mkdir()
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    url = ("--url", server["url"])
    done = relay(home, "install", *url, "--key-file", str(empty), stdin="")
    assert done.returncode == 2 and "API key:" not in done.stderr + done.stdout
    assert (
        done.stderr
        == f"relay: error: the key file {empty} is empty: the API key goes on its first line\n"
    )
    good = tmp_path / "good.key"
    good.write_text(server["key"] + "\n")
    both = relay(home, "install", *url, "--key", server["key"], "--key-file", str(good))
    assert both.returncode == 2 and "give --key or --key-file, not both" in both.stderr
    assert snapshot(home) == {}
    # RELAY_API_KEY in the environment is no --key: the file, given on the command line, wins.
    done = relay(
        home, "install", *url, "--key-file", str(good), RELAY_API_KEY="relay_x_" + "y" * 32
    )
    assert done.returncode == 0, done.stderr
    assert (home / ".relay/key").read_text() == server["key"] + "\n"


def test_running_install_again_keeps_the_installed_server_and_key(tmp_path, server):
    """QA: `relay install --key NEW_KEY`, doctor's fix for a bad key, asked for the server's
    URL again with a default of port 8765, and `relay install --agent claude-code` for both."""
    home = tmp_path
    assert install(home, server).returncode == 0
    again = relay(home, "install", "--agent", "claude-code", stdin="")
    assert again.returncode == 0, again.stderr
    assert f"Server {server['url']}, as installed" in again.stdout
    assert "Key: the one installed" in again.stdout
    reader = mint(server["url"], server["admin"], "install-reader", ["memory:read"])["secret"]
    swapped = relay(home, "install", "--key", reader, stdin="")
    assert swapped.returncode == 0, swapped.stderr
    assert (home / ".relay/key").read_text() == reader + "\n"
    assert json.loads((home / ".relay/config.json").read_text())["url"] == server["url"]


def test_a_key_install_replaces_is_kept_until_uninstall_and_both_say_so(tmp_path, server):
    """QA: `relay install --key OTHER` over an installed key overwrote ~/.relay/key with no
    backup: a secret is shown once, so a wrong paste (another organisation's key, one with
    fewer rights) lost the only copy of the key that worked."""
    home = tmp_path
    first = install(home, server)
    assert first.returncode == 0, first.stderr
    assert "  created    ~/.relay/key  (API key)\n" in first.stdout  # nothing to keep yet
    reader = mint(server["url"], server["admin"], "install-replaced", ["memory:read"])["secret"]
    again = relay(home, "install", "--key", reader, stdin="")
    assert again.returncode == 0, again.stderr
    (kept,) = (home / ".relay/backups").glob("key.*")
    assert kept.read_text() == server["key"] + "\n"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    shown = f"~/.relay/backups/{kept.name}"
    assert (
        f"  updated    ~/.relay/key  (API key; the key it replaced is kept in {shown}, mode 600,"
        " until `relay uninstall`)\n"
    ) in again.stdout
    assert (home / ".relay/key").read_text() == reader + "\n"
    same = relay(home, "install", "--key", reader, stdin="")  # the same key: nothing to keep
    assert "  unchanged  ~/.relay/key  (API key)\n" in same.stdout
    assert list((home / ".relay/backups").glob("key.*")) == [kept]

    dry = relay(home, "uninstall", "--dry-run")
    assert f"  would remove   {shown}  (a key a later install replaced)\n" in dry.stdout
    done = relay(home, "uninstall")
    assert done.returncode == 0, done.stderr
    assert f"  removed    {shown}  (a key a later install replaced)\n" in done.stdout
    assert not (home / ".relay").exists()


def test_install_is_idempotent_and_restores_default_knobs(tmp_path, server):
    home = tmp_path
    write(home / ".claude/settings.json", HOOK_LADEN_SETTINGS)
    assert install(home, server).returncode == 0
    first = snapshot(home)
    script = home / ".relay/relay-autosearch-hook.sh"
    script.write_text(script.read_text().replace("DEADLINE_MS=400", "DEADLINE_MS=900"))
    dry = install(home, server, "--dry-run")  # QA: it said "would unchanged" of the rest
    assert dry.returncode == 0, dry.stderr
    assert "  would update    ~/.relay/relay-autosearch-hook.sh" in dry.stdout
    assert "  would keep      ~/.claude/settings.json" in dry.stdout
    assert "unchanged" not in dry.stdout and "DEADLINE_MS=900" in script.read_text()
    again = install(home, server)
    assert again.returncode == 0, again.stderr
    assert "updated    ~/.relay/relay-autosearch-hook.sh" in again.stdout
    for name in ("~/.claude/settings.json", "~/.codex/hooks.json", "~/.codex/config.toml"):
        assert f"unchanged  {name}" in again.stdout
    assert "DEADLINE_MS=400" in script.read_text()

    def settled(files: dict) -> dict:  # the backup and its record differ, nothing else
        return {
            k: v for k, v in files.items() if not k.startswith((".relay/backups", ".relay/install"))
        }

    assert settled(snapshot(home)) == settled(first)
    for settings in (home / ".claude/settings.json", home / ".codex/hooks.json"):
        assert relay_entries(settings) == {"UserPromptSubmit": 1, "SessionStart": 1} | (
            {"PreToolUse": 0} if settings.parent.name == ".claude" else {}
        )
    assert (home / ".codex/config.toml").read_text().count("[mcp_servers.relay]") == 1
    # the original content is still what uninstall gives back, after two installs
    assert relay(home, "uninstall").returncode == 0
    assert (home / ".claude/settings.json").read_text() == HOOK_LADEN_SETTINGS
    assert not (home / ".relay").exists()


def test_a_key_file_others_may_read_is_made_the_owners_alone(tmp_path, server):
    """QA, following README ("keeps the key in ~/.relay/key (mode 0600)"): a key file
    written by hand under the usual umask (0644) and given to install as --key-file was
    left readable by every user of the machine, reported `unchanged`."""
    key = tmp_path / ".relay/key"
    write(key, server["key"] + "\n")
    key.chmod(0o644)
    dry = relay(tmp_path, "install", "--url", server["url"], "--key-file", str(key), "--dry-run")
    assert "  would update    ~/.relay/key" in dry.stdout, dry.stdout
    assert key.stat().st_mode & 0o777 == 0o644
    done = relay(tmp_path, "install", "--url", server["url"], "--key-file", str(key))
    assert done.returncode == 0, done.stderr
    assert "  updated    ~/.relay/key  (API key; mode 600, was 644)" in done.stdout
    assert key.stat().st_mode & 0o777 == 0o600 and key.read_text() == server["key"] + "\n"
    again = install(tmp_path, server)
    assert "  unchanged  ~/.relay/key  (API key)" in again.stdout
    assert relay(tmp_path, "uninstall").returncode == 0
    assert key.read_text() == server["key"] + "\n" and key.stat().st_mode & 0o777 == 0o600


def test_config_json_gets_no_knob_the_script_overrides(tmp_path, server):
    """QA: install wrote deadline_ms, min_prompt_len, throttle_prompts and overlap_threshold
    into config.json, where the script's values always beat them: `"min_prompt_len": 100`
    changed nothing. Install no longer writes them, drops the copies an older install left
    at their defaults, and says of any other value that it has no effect and where to set it."""
    home = tmp_path
    old_install = {
        "url": server["url"],
        "api_key_file": str(home / ".relay/key"),
        "deadline_ms": 400,
        "throttle_prompts": 2,
        "overlap_threshold": 0.3,
        "min_prompt_len": 100,  # set by hand, to no effect
        "log_prompt_text": True,
    }
    write(home / ".relay/config.json", json.dumps(old_install))
    dead = (
        "note: ~/.relay/config.json: min_prompt_len 100 here has no effect: the hook script's "
        "MIN_PROMPT_LEN, which beats it, is 15; set it there"
    )
    dry = install(home, server, "--agent", "claude-code", "--dry-run")  # QA: it said nothing
    assert dead in dry.stdout and json.loads((home / ".relay/config.json").read_text()) == (
        old_install
    )
    done = install(home, server, "--agent", "claude-code")
    assert done.returncode == 0, done.stderr
    config = json.loads((home / ".relay/config.json").read_text())
    assert set(config) & set(SCRIPT_KNOBS) == {"min_prompt_len"}
    assert config["log_prompt_text"] is True and config["max_records"] == 3
    assert dead in done.stdout
    command = registered_command(home / ".claude/settings.json", "UserPromptSubmit")
    run = run_registered(command, home, prompt_payload("how do I apply a database migration?"))
    assert b"make migrate" in run.stdout  # 36 characters: under 100, yet it searched

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert install(fresh, server).returncode == 0
    assert not set(json.loads((fresh / ".relay/config.json").read_text())) & set(SCRIPT_KNOBS)


def test_re_installing_with_no_mcp_takes_the_mcp_server_out_of_both_agents(tmp_path, server):
    """QA: `relay install --no-mcp` after an install with MCP took [mcp_servers.relay] out of
    config.toml but left mcpServers.relay in ~/.claude.json, unlisted, while install.json
    said "mcp": false and the closing text still said to restart for the MCP server."""
    home = tmp_path
    write(home / ".claude.json", '{"numStartups": 7, "mcpServers": {"docs": {"command": "d"}}}')
    write(home / ".codex/config.toml", EXISTING_CODEX_CONFIG)
    original = snapshot(home)
    assert install(home, server).returncode == 0
    assert "relay" in json.loads((home / ".claude.json").read_text())["mcpServers"]

    done = install(home, server, "--no-mcp")
    assert done.returncode == 0, done.stderr
    claude_json = json.loads((home / ".claude.json").read_text())
    assert claude_json == {"numStartups": 7, "mcpServers": {"docs": {"command": "d"}}}
    assert "relay" not in tomllib.loads((home / ".codex/config.toml").read_text())["mcp_servers"]
    assert "updated    ~/.claude.json  (without the MCP server `relay`; backup" in done.stdout
    assert "~/.codex/config.toml  ([features] hooks, without [mcp_servers.relay]" in done.stdout
    assert "MCP server (check with /mcp)" not in done.stdout
    assert "no `relay` MCP server is registered" in done.stdout
    assert json.loads((home / ".relay/install.json").read_text())["mcp"] is False
    again = install(home, server, "--no-mcp")
    assert "unchanged  ~/.claude.json" in again.stdout

    assert relay(home, "uninstall").returncode == 0
    assert snapshot(home) == original


def test_no_mcp_leaves_an_mcp_server_relay_did_not_write(tmp_path, server):
    """A `relay` server the user registered themselves stays through install, --no-mcp and
    uninstall: one that runs something else is never Relay's, and one that was there before
    Relay's install comes back when Relay's goes."""
    home = tmp_path
    own = {"command": "/opt/relay-proxy", "args": ["--stdio"]}
    write(home / ".claude.json", json.dumps({"mcpServers": {"relay": own}}))
    assert install(home, server).returncode == 0
    assert install(home, server, "--no-mcp").returncode == 0
    assert json.loads((home / ".claude.json").read_text())["mcpServers"] == {"relay": own}

    other = tmp_path / "other"
    before = {"command": "/usr/local/bin/relay", "args": ["mcp"]}  # the user's own, earlier
    write(other / ".claude.json", json.dumps({"mcpServers": {"relay": before}}))
    assert install(other, server).returncode == 0
    assert json.loads((other / ".claude.json").read_text())["mcpServers"]["relay"] != before
    assert install(other, server, "--no-mcp").returncode == 0
    assert json.loads((other / ".claude.json").read_text())["mcpServers"] == {"relay": before}

    fresh = tmp_path / "fresh"  # never installed with MCP: ~/.claude.json is not Relay's
    write(fresh / ".claude.json", json.dumps({"mcpServers": {"relay": before}}))
    done = install(fresh, server, "--no-mcp")
    assert done.returncode == 0 and "~/.claude.json" not in done.stdout
    assert json.loads((fresh / ".claude.json").read_text())["mcpServers"] == {"relay": before}


def test_uninstall_keeps_what_the_user_changed_after_install(tmp_path, server):
    home = tmp_path
    write(home / ".claude/settings.json", EXISTING_SETTINGS)
    assert install(home, server).returncode == 0
    settings = home / ".claude/settings.json"
    doc = json.loads(settings.read_text())
    doc["theme"] = "dark"
    settings.write_text(json.dumps(doc))
    assert relay(home, "uninstall").returncode == 0
    assert json.loads(settings.read_text()) == {**json.loads(EXISTING_SETTINGS), "theme": "dark"}


def test_project_install_uses_home_relative_commands(tmp_path, server):
    home, project = tmp_path / "home", tmp_path / "repo"
    home.mkdir()
    project.mkdir()
    done = install(home, server, "--project", str(project))
    assert done.returncode == 0, done.stderr
    command = registered_command(project / ".claude/settings.json", "UserPromptSubmit")
    assert command.startswith('[ -x "$HOME/.relay/relay-autosearch-hook.sh" ]')
    assert (project / ".codex/hooks.json").exists()
    assert not (home / ".claude/settings.json").exists()
    assert (home / ".claude.json").exists()  # the MCP server stays a user-level registration
    run = run_registered(command, home, prompt_payload("how do I apply a database migration?"))
    assert run.returncode == 0 and b"make migrate" in run.stdout
    assert relay(home, "uninstall").returncode == 0
    assert snapshot(project) == {}
    assert all(name.startswith(".relay/state/") for name in snapshot(home))  # the hook's own log


# -- the install record: skill install's files, and relay uninstall --project ----------------
def manifest_of(home: Path) -> dict:
    return json.loads((home / ".relay/install.json").read_text())


def test_skill_install_adds_to_the_record_an_older_install_wrote(tmp_path, server):
    """Skill install records its files in install.json: beside install's records, in a
    record an older Relay wrote (no "skills"), and uninstall then takes out both."""
    home = tmp_path
    assert install(home, server).returncode == 0
    manifest = manifest_of(home)
    older = {k: v for k, v in manifest.items() if k != "skills"}
    (home / ".relay/install.json").write_text(json.dumps(older, indent=2))
    assert relay(home, "skill", "install").returncode == 0
    both = manifest_of(home)
    assert both["files"] == manifest["files"] and both["version"] == 1
    assert set(both["skills"]) == {
        str(home / ".claude/skills/relay/SKILL.md"),
        str(home / ".relay/relay-skill.zip"),
    }
    assert relay(home, "doctor").returncode == 0
    assert relay(home, "uninstall").returncode == 0
    assert snapshot(home) == {}
    assert list(home.iterdir()) == []


def test_uninstall_removes_a_skill_installed_before_skill_install_kept_a_record(tmp_path, server):
    home = tmp_path
    assert install(home, server).returncode == 0
    assert relay(home, "skill", "install").returncode == 0
    manifest = manifest_of(home)
    del manifest["skills"]  # as an older Relay left it
    (home / ".relay/install.json").write_text(json.dumps(manifest))
    done = relay(home, "uninstall")
    assert done.returncode == 0, done.stderr
    assert "removed    ~/.claude/skills/relay/SKILL.md" in done.stdout
    assert snapshot(home) == {}


def recorded_under(manifest: dict, folder: Path) -> list[str]:
    return [p for key in ("files", "skills") for p in manifest.get(key, {}) if folder.name in p]


def test_project_uninstall_leaves_the_user_install_and_other_projects(tmp_path, server):
    """`relay uninstall` undid every install at once: a project was taken out only with
    the user-level wiring and every other project. `--project DIR` undoes DIR's records
    alone, backups included, and rewrites the record for the rest."""
    home, mine, other = tmp_path / "home", tmp_path / "mine", tmp_path / "other"
    for folder in (home, mine, other):
        folder.mkdir()
    write(mine / ".claude/settings.json", EXISTING_SETTINGS)
    write(other / ".claude/settings.json", EXISTING_SETTINGS)
    write(home / ".claude/settings.json", EXISTING_SETTINGS)
    mine_before, other_before, home_before = snapshot(mine), snapshot(other), snapshot(home)
    assert install(home, server).returncode == 0
    assert install(home, server, "--project", str(other)).returncode == 0
    done = install(home, server, "--project", str(mine))
    assert done.returncode == 0, done.stderr
    assert f"relay uninstall --project {mine}` (this project only)" in done.stdout
    assert relay(home, "skill", "install", "--project", str(mine)).returncode == 0
    assert relay(home, "skill", "install").returncode == 0
    home_installed, other_installed = snapshot(home), snapshot(other)
    manifest = manifest_of(home)
    backups = set(os.listdir(home / ".relay/backups"))
    assert len(backups) == 3  # one settings.json each: user, other, mine

    dry = relay(home, "uninstall", "--project", str(mine), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would restore  {mine}/.claude/settings.json" in dry.stdout
    assert f"would remove   {mine}/.claude/skills/relay/SKILL.md" in dry.stdout
    assert "~/.relay" not in dry.stdout.replace("would rewrite  ~/.relay/install.json", "")
    assert snapshot(home) == home_installed and manifest_of(home) == manifest

    done = relay(home, "uninstall", "--project", str(mine))
    assert done.returncode == 0, done.stderr
    assert snapshot(mine) == mine_before  # the original back, byte for byte; the rest gone
    assert sorted(p.name for p in mine.rglob("*")) == [".claude", "settings.json"]
    assert snapshot(other) == other_installed
    left = snapshot(home)
    gone = set(home_installed) - set(left)
    assert len(gone) == 1 and gone.pop().startswith(".relay/backups/")  # mine's backup only
    assert {k: v for k, v in left.items() if k != ".relay/install.json"} == {
        k: v for k, v in home_installed.items() if k in left and k != ".relay/install.json"
    }
    rewritten = manifest_of(home)
    assert stat.S_IMODE((home / ".relay/install.json").stat().st_mode) == 0o600
    assert recorded_under(rewritten, mine) == []
    assert recorded_under(rewritten, other) == recorded_under(manifest, other) != []
    for key in ("files", "skills"):
        kept = {p: r for p, r in manifest[key].items() if not p.startswith(str(mine))}
        assert rewritten[key] == kept
    assert rewritten["url"] == manifest["url"]

    again = relay(home, "uninstall", "--project", str(mine))
    assert again.returncode == 0
    assert again.stdout.startswith(f"Nothing recorded for {mine}") and "Nothing was changed" in (
        again.stdout
    )
    assert relay(home, "uninstall").returncode == 0
    assert snapshot(other) == other_before and snapshot(home) == home_before


def test_project_uninstall_drops_the_records_of_a_project_deleted_since(tmp_path, server):
    """QA: `relay uninstall --project DIR` refused a DIR that was deleted, so doctor's note
    about its stale records could only be acted on by hand-editing install.json."""

    home, gone = tmp_path / "home", tmp_path / "gone"
    for folder in (home, gone):
        folder.mkdir()
    assert install(home, server).returncode == 0
    assert install(home, server, "--project", str(gone)).returncode == 0
    assert relay(home, "skill", "install", "--project", str(gone)).returncode == 0
    installed_home = snapshot(home)
    assert recorded_under(manifest_of(home), gone) != []
    shutil.rmtree(gone)
    done = relay(home, "uninstall", "--project", str(gone))
    assert done.returncode == 0, done.stderr
    assert not gone.exists()  # nothing made again
    assert recorded_under(manifest_of(home), gone) == []
    left = {k: v for k, v in snapshot(home).items() if k != ".relay/install.json"}
    assert left == {k: v for k, v in installed_home.items() if k != ".relay/install.json"}


def test_a_project_that_is_the_user_level_install_is_refused(tmp_path, server):
    """QA: `relay install --project ~` wrote the user's settings as a project's, and `relay
    uninstall --project ~` then took out the user-level install while printing "the
    user-level install and other projects stay"."""
    home, repo, shared = tmp_path / "home", tmp_path / "repo", tmp_path / "shared"
    for folder in (home, repo, shared):
        folder.mkdir()
    (repo / ".claude").symlink_to(home / ".claude")  # a project whose .claude/ is the user's
    codex = shared / "codex"  # CODEX_HOME inside a project
    assert install(home, server).returncode == 0
    assert relay(home, "skill", "install").returncode == 0
    installed, manifest = snapshot(home), manifest_of(home)
    tail = "nothing was changed\n"
    for project, why, env in (
        (home, "~ is your home folder, whose .claude/ and .codex/ are the user-level install", {}),
        (tmp_path, f"{tmp_path} holds your home folder, and with it the user-level install", {}),
        (repo, f"{repo} has the user-level ~/.claude as its .claude/", {}),
        (shared, f"{shared} holds the user-level {codex}", {"CODEX_HOME": str(codex)}),
    ):
        for command in ("install", "uninstall", "skill install"):
            args = ["--url", server["url"], "--key", server["key"]] if command == "install" else []
            done = relay(home, *command.split(), *args, "--project", str(project), **env)
            assert (done.returncode, done.stdout) == (2, ""), done.stdout
            assert done.stderr == (
                f"relay: error: --project {why}: name the project's own folder, or run"
                f" `relay {command}` without --project for the user-level one; {tail}"
            )
            assert snapshot(home) == installed and manifest_of(home) == manifest
    assert snapshot(repo) == {} and snapshot(shared) == {}
    assert relay(home, "uninstall").returncode == 0  # still the user-level install, whole


def test_uninstall_with_nothing_installed_says_there_was_nothing_to_remove(tmp_path, server):
    """QA: `relay uninstall` in a HOME with nothing installed said "Relay is no longer wired
    into the agents on this machine.", as if it had taken something out. Agents' settings
    without Relay in them are nothing to remove either; once installed and uninstalled, a
    second uninstall finds nothing."""
    nothing = (
        "Nothing to remove: no install record (~/.relay/install.json), and no Relay hooks, MCP"
        " server, hook script or skill where install puts them. Nothing was changed.\n"
    )
    empty = relay(tmp_path, "uninstall")
    assert (empty.returncode, empty.stdout, empty.stderr) == (0, nothing, "")
    (tmp_path / ".claude").mkdir()
    (tmp_path / ".claude/settings.json").write_text('{"theme": "dark"}\n')
    before = snapshot(tmp_path)
    for args in (("uninstall",), ("uninstall", "--dry-run")):
        done = relay(tmp_path, *args)
        assert (done.returncode, done.stdout) == (0, nothing), done.stderr
    assert snapshot(tmp_path) == before

    home = tmp_path / "again"
    home.mkdir()
    assert install(home, server).returncode == 0
    first = relay(home, "uninstall")
    assert first.stdout.endswith("Relay is no longer wired into the agents on this machine.\n")
    assert relay(home, "uninstall").stdout == nothing


def test_uninstall_with_nothing_installed_reads_no_settings_file_without_relay_in_it(tmp_path):
    """QA: with no install record, a settings.json holding comments (JSONC, which install
    refuses to edit) stopped `relay uninstall` with "Relay is still wired in", exit 1, in a
    HOME where Relay had never written anything."""
    write(tmp_path / ".claude/settings.json", '{\n  // mine\n  "model": "opus",\n}\n')
    before = snapshot(tmp_path)
    done = relay(tmp_path, "uninstall")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("Nothing to remove")
    assert snapshot(tmp_path) == before


def test_uninstall_help_names_the_project_and_the_skill():
    from click.testing import CliRunner

    from relay.cli import cli

    out = CliRunner().invoke(cli, ["uninstall", "--help"], terminal_width=200).output
    assert "--project" in out and "relay skill install" in out and "other projects" in out


# -- the registered commands, run as the agents run them -------------------------------------
def prompt_payload(prompt: str, session: str = "sess-1", **extra) -> dict:
    return {
        "session_id": session,
        "prompt_id": "p-1",
        "transcript_path": "/tmp/transcript.jsonl",
        "cwd": "/tmp",
        "permission_mode": "default",
        "hook_event_name": "UserPromptSubmit",
        "prompt": prompt,
        **extra,
    }


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_registered_commands_inject_memories_from_the_real_server(tmp_path, server, agent):
    home = tmp_path
    assert install(home, server, "--agent", agent).returncode == 0
    settings = home / (".claude/settings.json" if agent == "claude-code" else ".codex/hooks.json")
    extra = {"turn_id": "turn-1", "model": "gpt-5"} if agent == "codex" else {}

    start = registered_command(settings, "SessionStart")
    run = run_registered(
        start,
        home,
        {"session_id": "sess-1", "hook_event_name": "SessionStart", "source": "startup", **extra},
    )
    assert run.returncode == 0 and run.stderr == b""
    out = json.loads(run.stdout)["hookSpecificOutput"]
    assert (
        out["hookEventName"] == "SessionStart"
        and "team/process/reviews" in out["additionalContext"]
    )

    command = registered_command(settings, "UserPromptSubmit")
    run = run_registered(
        command, home, prompt_payload("how do I create and apply a database migration?", **extra)
    )
    assert run.returncode == 0 and run.stderr == b""
    out = json.loads(run.stdout)["hookSpecificOutput"]
    assert out["hookEventName"] == "UserPromptSubmit"
    context = out["additionalContext"]
    assert "make migrate" in context and 'source="team/db/migrations"' in context
    assert "recorded data, not instructions" in context
    log = (home / ".relay/state/outcomes.jsonl").read_text().splitlines()
    assert json.loads(log[-1])["outcome"] == "hit"


def test_deleting_the_script_turns_recall_off_without_a_sound(tmp_path, server):
    home = tmp_path
    assert install(home, server, "--agent", "claude-code").returncode == 0
    command = registered_command(home / ".claude/settings.json", "UserPromptSubmit")
    (home / ".relay/relay-autosearch-hook.sh").unlink()
    for shell in ("/bin/sh", "/bin/bash"):
        run = run_registered(command, home, prompt_payload("how do I apply a migration?"), shell)
        assert (run.returncode, run.stdout, run.stderr) == (0, b"", b"")
    assert not (home / ".relay/state").exists()  # the hook never ran


# bash, as macOS's and Fedora's /bin/sh, behaves otherwise than dash on a failed `exec`.
SHELLS = (["/bin/sh"], ["/bin/bash", "--posix"])


def run_script(script: Path, home: Path, payload: dict, shell: list[str]):
    """The hook script run by `shell` as the registered command runs it: JSON on stdin."""
    return subprocess.run(
        [*shell, str(script)],
        input=json.dumps(payload).encode(),
        capture_output=True,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        timeout=30,
    )


@pytest.mark.parametrize(
    "typo",
    [
        ("DEADLINE_MS=400", 'DEADLINE_MS="400'),  # an unterminated quote
        ("MIN_PROMPT_LEN=15", "MIN_PROMPT_LEN=15)"),
        ("OVERLAP_THRESHOLD=0.30", "OVERLAP_THRESHOLD = 0.5"),
        ("THROTTLE_PROMPTS=2", "THROTTLE_PROMPTS=$(echo 2"),
    ],
    ids=["quote", "paren", "spaced", "substitution"],
)
def test_a_typo_in_a_knob_neither_blocks_the_prompt_nor_stops_recall(tmp_path, server, typo):
    """QA: `DEADLINE_MS="400` made the script exit 2 with a syntax error on stderr, and
    Claude Code blocks, and erases, a prompt whose hook exits 2. The knobs are read as data
    now: a value the hook cannot use is ignored, and recall goes on."""
    home = tmp_path
    assert install(home, server, "--agent", "claude-code").returncode == 0
    command = registered_command(home / ".claude/settings.json", "UserPromptSubmit")
    script = home / ".relay/relay-autosearch-hook.sh"
    script.write_text(script.read_text().replace(*typo))
    for n, shell in enumerate(SHELLS):
        payload = prompt_payload("how do I create a database migration?", session=f"s{n}")
        run = run_script(script, home, payload, shell)
        assert (run.returncode, run.stderr) == (0, b""), shell
        assert b"make migrate" in run.stdout, shell
    run = run_registered(command, home, prompt_payload("how do I apply a migration?", "s3"))
    assert (run.returncode, run.stderr) == (0, b"") and b"make migrate" in run.stdout


@pytest.mark.parametrize(
    "breakage",
    [
        ("\nexec /", "\nif then\nexec /"),  # a syntax error outside the knobs
        ("\nKNOBS\n", "\n"),  # the knobs' end marker deleted
        ("\nexec /", "\nno-such-command\nexec /"),
    ],
    ids=["syntax", "no-end-marker", "unknown-command"],
)
def test_a_broken_script_exits_0_and_prints_nothing(tmp_path, server, breakage):
    home = tmp_path
    assert install(home, server, "--agent", "claude-code").returncode == 0
    command = registered_command(home / ".claude/settings.json", "UserPromptSubmit")
    script = home / ".relay/relay-autosearch-hook.sh"
    script.write_text(script.read_text().replace(*breakage, 1))
    payload = prompt_payload("which cluster do we deploy staging to?")
    for shell in SHELLS:
        run = run_script(script, home, payload, shell)
        assert (run.returncode, run.stderr) == (0, b""), shell
    run = run_registered(command, home, payload)
    assert (run.returncode, run.stderr) == (0, b"")


def test_a_moved_relay_hook_exits_0_silently(tmp_path, server):
    """QA: with the venv moved, every prompt ended in exit 127 and `exec: .../relay-hook:
    not found` on stderr (dash), which the agent shows; bash skips the EXIT trap there."""
    home = tmp_path
    assert install(home, server, "--agent", "claude-code").returncode == 0
    command = registered_command(home / ".claude/settings.json", "UserPromptSubmit")
    script = home / ".relay/relay-autosearch-hook.sh"
    script.write_text(script.read_text().replace(str(BIN), str(tmp_path / "oldvenv/bin")))
    assert str(tmp_path / "oldvenv/bin/relay-hook") in script.read_text()
    payload = prompt_payload("which cluster do we deploy staging to?")
    for shell in SHELLS:
        run = run_script(script, home, payload, shell)
        assert (run.returncode, run.stdout, run.stderr) == (0, b"", b""), shell
    run = run_registered(command, home, payload)
    assert (run.returncode, run.stdout, run.stderr) == (0, b"", b"")


def test_re_installing_mends_an_old_script_and_keeps_the_registered_command(tmp_path, server):
    """An install made before the script was guarded is mended by `relay install`: the
    script is rewritten, the agents' commands stay as they were (Codex keeps its trust),
    and uninstall still takes out exactly what install put in."""
    home = tmp_path
    write(home / ".claude/settings.json", EXISTING_SETTINGS)
    original = snapshot(home)
    assert install(home, server).returncode == 0
    script = home / ".relay/relay-autosearch-hook.sh"
    typo = old_script(str(BIN / "relay-hook")).replace("DEADLINE_MS=400", 'DEADLINE_MS="400')
    script.write_text(typo)  # a user's typo in a script from before the guard
    command = registered_command(home / ".claude/settings.json", "UserPromptSubmit")
    payload = prompt_payload("how do I create a database migration?")
    run = run_registered(command, home, payload)
    assert run.returncode == 2 and b"Syntax error" in run.stderr  # what blocked the prompt

    again = install(home, server)
    assert again.returncode == 0, again.stderr
    assert "updated    ~/.relay/relay-autosearch-hook.sh" in again.stdout
    for name in ("~/.claude/settings.json", "~/.codex/hooks.json"):
        assert f"unchanged  {name}" in again.stdout
    assert registered_command(home / ".claude/settings.json", "UserPromptSubmit") == command
    script.write_text(script.read_text().replace("DEADLINE_MS=400", 'DEADLINE_MS="400'))
    run = run_registered(command, home, payload)
    assert (run.returncode, run.stderr) == (0, b"") and b"make migrate" in run.stdout

    assert relay(home, "uninstall").returncode == 0
    assert {k: v for k, v in snapshot(home).items() if not k.startswith(".relay/state")} == (
        original
    )


def test_what_doctor_and_eval_read_from_the_script_is_what_it_hands_the_hook(tmp_path):
    """The script's reading (doctor) and `set_script_knobs` (eval --apply) read knob lines as
    the script does; the script here execs `env`, to show what the hook would get."""
    from relay.knob_script import hook_script, read_file, set_script_knobs

    script = tmp_path / "relay-autosearch-hook.sh"
    text = hook_script("/usr/bin/env")
    for old, new in (
        ("DEADLINE_MS=400", 'DEADLINE_MS="450'),
        ("MIN_PROMPT_LEN=15", "MIN_PROMPT_LEN=15)"),
        ("OVERLAP_THRESHOLD=0.30", "  OVERLAP_THRESHOLD = '0.5'  "),
        ("THROTTLE_PROMPTS=2", "THROTTLE_PROMPTS 4\nTHROTTLE_PROMPTS=9"),  # the first wins
    ):
        assert old in text
        text = text.replace(old, new)
    script.write_text(text)
    script.chmod(0o700)

    def handed(environ: dict[str, str]) -> dict[str, str]:
        for shell in SHELLS:
            run = subprocess.run([*shell, str(script)], capture_output=True, env=environ)
            got = dict(line.split("=", 1) for line in run.stdout.decode().splitlines())
            assert {k: v for k, v in got.items() if k.startswith("RELAY_")} == {
                k: v for k, v in read_file(script).handed(environ).items() if k.startswith("RELAY_")
            }, shell
        return got

    got = handed({"PATH": "/usr/bin:/bin"})
    assert got["RELAY_DEADLINE_MS"] == "450" and got["RELAY_MIN_PROMPT_LEN"] == "15)"
    assert got["RELAY_OVERLAP_THRESHOLD"] == "0.5" and got["RELAY_THROTTLE_PROMPTS"] == "4"
    assert handed({"RELAY_DEADLINE_MS": "700"})["RELAY_DEADLINE_MS"] == "700"

    assert set_script_knobs(script, {"overlap_threshold": 0.2, "throttle_prompts": 0})
    got = handed({})
    assert got["RELAY_OVERLAP_THRESHOLD"] == "0.20" and got["RELAY_THROTTLE_PROMPTS"] == "0"
    assert "THROTTLE_PROMPTS=9" in script.read_text()  # only the line the script reads


def test_knob_edits_apply_on_the_next_prompt(tmp_path, server):
    home = tmp_path
    assert install(home, server, "--agent", "claude-code").returncode == 0
    command = registered_command(home / ".claude/settings.json", "UserPromptSubmit")
    script = home / ".relay/relay-autosearch-hook.sh"
    script.write_text(script.read_text().replace("MIN_PROMPT_LEN=15", "MIN_PROMPT_LEN=500"))
    run = run_registered(command, home, prompt_payload("how do I create a database migration?"))
    assert run.stdout == b""
    entry = json.loads((home / ".relay/state/outcomes.jsonl").read_text().splitlines()[-1])
    assert (entry["outcome"], entry["reason"]) == ("skipped", "short_prompt")


def test_the_environment_still_overrides_the_scripts_knobs(tmp_path, server):
    """docs/hook.md: environment, then config file, then defaults. The script set its
    knobs unconditionally, so `RELAY_MIN_PROMPT_LEN=500` exported for a session was lost."""
    home = tmp_path
    assert install(home, server, "--agent", "claude-code").returncode == 0
    command = registered_command(home / ".claude/settings.json", "UserPromptSubmit")
    payload = prompt_payload("how do I create a database migration?")
    run = run_registered(command, home, payload, extra_env={"RELAY_MIN_PROMPT_LEN": "500"})
    assert (run.returncode, run.stdout) == (0, b"")
    entry = json.loads((home / ".relay/state/outcomes.jsonl").read_text().splitlines()[-1])
    assert (entry["outcome"], entry["reason"]) == ("skipped", "short_prompt")


def test_the_registered_command_costs_a_few_milliseconds(tmp_path, server):
    """The wrapper (`[ -x ] && exec script`, then the script's `exec relay-hook`) against
    relay-hook started directly, both on a gated prompt (no network), interleaved."""
    home = tmp_path
    assert install(home, server, "--agent", "claude-code").returncode == 0
    command = registered_command(home / ".claude/settings.json", "UserPromptSubmit")
    payload = prompt_payload("ok")  # shorter than MIN_PROMPT_LEN: skipped before any request
    env = {
        "HOME": str(home),
        "PATH": "/usr/bin:/bin",
        "RELAY_MIN_PROMPT_LEN": "15",
        "RELAY_DEADLINE_MS": "400",
    }

    direct, wrapped = [], []
    for _ in range(15):
        t = time.perf_counter()
        subprocess.run(
            [str(BIN / "relay-hook")], input=json.dumps(payload).encode(), env=env, check=True
        )
        direct.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        assert run_registered(command, home, payload).returncode == 0
        wrapped.append((time.perf_counter() - t) * 1000)
    overhead = statistics.median(wrapped) - statistics.median(direct)
    print(f"registered command overhead: {overhead:.1f} ms (median of 15)")
    assert overhead < 40


def test_the_readme_one_minute_path(tmp_path, server):
    """README "First memory in a minute", step by step, in an empty HOME."""
    home = tmp_path
    assert install(home, server).returncode == 0
    made = relay(
        home,
        "remember",
        "Staging is the blue cluster; production is green.",
        "--source",
        "team/infra",
    )
    assert made.returncode == 0 and made.stdout.startswith("remembered mem_"), made.stderr
    checked = relay(home, "doctor")
    assert checked.returncode == 0, checked.stdout

    by_hand = subprocess.run(
        [str(home / ".relay/relay-autosearch-hook.sh")],
        input=b'{"session_id":"s1","prompt_id":"p1","hook_event_name":"UserPromptSubmit",'
        b'"prompt":"which cluster do we deploy staging to?"}',
        capture_output=True,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        timeout=30,
    )
    context = json.loads(by_hand.stdout)["hookSpecificOutput"]["additionalContext"]
    assert "Staging is the blue cluster" in context and 'source="team/infra"' in context


def test_edit_help_says_what_an_edit_keeps():
    """QA: `relay edit --help` said `--audience` defaults to all, but an edit keeps the
    memory's audiences unless given (the PATCH changes only the fields it carries)."""
    from click.testing import CliRunner

    from relay.cli import cli

    edit = CliRunner().invoke(cli, ["edit", "--help"], terminal_width=200).output
    remember = CliRunner().invoke(cli, ["remember", "--help"], terminal_width=200).output
    assert "replaces its audiences; kept if not given" in edit and "default all" not in edit
    assert "default all" in remember


# -- uninstall that cannot finish ----------------------------------------------------------
@contextlib.contextmanager
def unchangeable(path: Path):
    """`path` made impossible to replace or remove, by real means: the immutable attribute
    for root (who ignores permissions), a read-only folder for anyone else."""
    if os.geteuid() != 0:
        mode = path.parent.stat().st_mode
        path.parent.chmod(0o555)
        try:
            yield
        finally:
            path.parent.chmod(mode)
        return
    with immutable(path):
        yield


@pytest.mark.parametrize("locked", [".claude/settings.json", ".codex/config.toml"])
def test_uninstall_changes_nothing_when_one_file_cannot_be_changed(tmp_path, server, locked):
    """QA: with settings.json immutable, uninstall deleted the key, the config and the hook
    script first, printed nothing of it, then stopped, leaving the hooks behind. Every file
    is checked first now (config.toml comes last, so ordering alone would not do)."""
    home = tmp_path
    write(home / ".claude/settings.json", EXISTING_SETTINGS)
    write(home / ".codex/config.toml", EXISTING_CODEX_CONFIG)
    original = snapshot(home)
    assert install(home, server).returncode == 0
    installed = snapshot(home)
    with unchangeable(home / locked):
        stopped = relay(home, "uninstall")
    assert snapshot(home) == installed
    assert stopped.returncode == 1
    assert f"~/{locked}" in stopped.stderr and "Nothing was changed" in stopped.stderr
    assert "removed" not in stopped.stdout and "restored" not in stopped.stdout
    assert relay(home, "uninstall").returncode == 0
    assert snapshot(home) == original


@pytest.mark.parametrize("locked", [".claude/settings.json", ".codex/config.toml"])
def test_install_changes_nothing_when_one_file_cannot_be_changed(tmp_path, server, locked):
    """Install wrote its files one after another: an immutable config.toml stopped it after
    the key, the script and the Claude settings were written, and before the install record
    that uninstall needs. Every file is checked first now, as uninstall does."""
    home = tmp_path
    write(home / ".claude/settings.json", EXISTING_SETTINGS)
    write(home / ".codex/config.toml", EXISTING_CODEX_CONFIG)
    original = snapshot(home)
    with unchangeable(home / locked):
        stopped = install(home, server)
    assert snapshot(home) == original
    assert stopped.returncode == 1
    assert f"~/{locked}" in stopped.stderr and "Nothing was changed" in stopped.stderr
    assert install(home, server).returncode == 0


def test_a_settings_file_linked_into_a_missing_folder_stops_install_before_anything(
    tmp_path, server
):
    """QA: with ~/.claude/settings.json a link into a dotfiles folder that does not exist,
    install wrote the key, config and script, then failed with a traceback, before the
    install record uninstall needs."""
    home = tmp_path
    (home / ".claude").mkdir()
    (home / ".claude/settings.json").symlink_to(home / "dotfiles/missing.json")
    original = snapshot(home)
    stopped = install(home, server)
    assert stopped.returncode == 1 and "Traceback" not in stopped.stderr
    assert "~/.claude/settings.json: it is a link to" in stopped.stderr
    assert "in a folder that does not exist" in stopped.stderr
    assert snapshot(home) == original


def test_an_uninstall_stopped_part_way_says_what_it_did_and_what_is_left(
    tmp_path, server, monkeypatch
):
    """A failure no check foresaw (here a write that raises) stops the run: the agents'
    settings go first, Relay's own files and the install record last, and the error names
    what was undone and what was not; a second run finishes the job."""
    from click.testing import CliRunner

    from relay import uninstall as uninstaller
    from relay.errors import RelayError

    home = tmp_path
    write(home / ".claude/settings.json", EXISTING_SETTINGS)
    write(home / ".codex/config.toml", EXISTING_CODEX_CONFIG)
    original = snapshot(home)
    assert install(home, server).returncode == 0
    real_write = uninstaller.write_atomic

    def failing_write(path: Path, data: bytes, mode: int, force_mode: bool = False) -> None:
        if path.name == "config.toml":
            raise OSError(errno.EIO, "Input/output error")
        real_write(path, data, mode, force_mode)

    monkeypatch.setattr(uninstaller, "write_atomic", failing_write)
    env = {"HOME": str(home), "RELAY_CONFIG": None, "CLAUDE_CONFIG_DIR": None, "CODEX_HOME": None}
    stopped = CliRunner().invoke(uninstaller.uninstall, [], env=env)
    assert isinstance(stopped.exception, RelayError)
    message = stopped.exception.message
    assert message.startswith("uninstall stopped at ~/.codex/config.toml: Input/output error")
    assert "Already undone: ~/.claude/settings.json, ~/.claude.json, ~/.codex/hooks.json" in message
    assert "Not yet: ~/.codex/config.toml, ~/.relay/key, ~/.relay/config.json" in message
    assert "restored   ~/.claude/settings.json" in stopped.stdout
    assert "removed    ~/.codex/hooks.json" in stopped.stdout
    assert "~/.relay/key" not in stopped.stdout
    for kept in (".relay/key", ".relay/config.json", ".relay/install.json"):
        assert (home / kept).exists(), kept
    monkeypatch.undo()
    finished = relay(home, "uninstall")
    assert finished.returncode == 0, finished.stderr
    assert snapshot(home) == original


def test_install_after_a_broken_config_is_moved_aside_takes_the_recorded_url(tmp_path, server):
    """QA: for a config.json that is not JSON doctor said "run `relay install` again", which
    refuses the broken file; moved aside, install prompted for the URL with the 8765 default
    though ~/.relay/install.json records the url."""
    home = tmp_path
    assert install(home, server).returncode == 0
    config = home / ".relay/config.json"
    config.write_text(config.read_text().replace('",', '"', 1))  # a comma lost in an edit
    fix = [
        f["fix"]
        for f in json.loads(relay(home, "doctor", "--json").stdout)
        if f["area"] == "config" and f["level"] == "fail"
    ]
    assert fix == [
        "fix the file, or move it aside and run `relay install` (it will not rewrite a file it"
        " cannot read; it takes the url ~/.relay/install.json records)"
    ]
    config.rename(home / ".relay/config.json.broken")
    again = relay(home, "install", "--key", server["key"], stdin="")
    assert again.returncode == 0, again.stderr
    assert f"Server {server['url']}, as ~/.relay/install.json records" in again.stdout
    assert json.loads(config.read_text())["url"] == server["url"]


def test_install_with_another_url_does_not_send_the_installed_key_there(tmp_path):
    """Review: `relay install --url OTHER` reused the installed key and sent it to OTHER's
    /v1/whoami, under --dry-run too. The installed key goes only to the installed server:
    without a terminal install refuses, on one it asks for OTHER's key."""
    import pty

    from hook_support import FakeRelay, reply

    who = {"org": {"name": "acme"}, "key": {"id": "k1", "scopes": ["memory:read"]}}
    key, typed, chosen = ("relay_k_" + c * 24 for c in "xyz")
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/key").write_text(key + "\n")
    with FakeRelay(reply(200, who)) as installed, FakeRelay(reply(200, who)) as other:
        config = {"url": installed.url, "api_key_file": str(tmp_path / ".relay/key")}
        (tmp_path / ".relay/config.json").write_text(json.dumps(config))
        done = relay(tmp_path, "install", "--url", other.url, "--dry-run", stdin="")
        assert other.connections == 0
        assert done.returncode == 2 and done.stdout == "", done.stdout
        assert done.stderr == (
            f"relay: error: {other.url} is not the server this machine's key is for"
            f" ({installed.url}): pass --key KEY or --key-file FILE (or set RELAY_API_KEY_FILE)"
            " for that server"
            " (see 'relay install --help')\n"
        )
        # On a terminal it asks for that server's key, and sends only the key typed. A new
        # session has no /dev/tty, so the key is read from the terminal given as stdin; it
        # is typed once the prompt shows (turning echo off flushes what came before).
        leader, follower = pty.openpty()
        asked = subprocess.Popen(
            [RELAY, "install", "--url", other.url, "--dry-run"],
            env=clean_env(tmp_path),
            stdin=follower,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            os.close(follower)
            prompt = b""
            while not prompt.endswith(b"API key: "):
                chunk = os.read(asked.stderr.fileno(), 100)
                assert chunk, prompt
                prompt += chunk
            os.write(leader, (typed + "\n").encode())
            out, err = asked.communicate(timeout=60)
        finally:
            asked.kill()
            asked.wait()
            os.close(leader)
        assert asked.returncode == 0, err
        assert f"{other.url} is not the server this machine's key is for" in out.decode()
        assert [r.headers["authorization"] for r in other.requests] == [f"Bearer {typed}"]
        # A key file this shell names is the user's choice for it, as for every command.
        (tmp_path / "chosen.key").write_text(chosen + "\n")
        by_env = {"RELAY_API_KEY_FILE": str(tmp_path / "chosen.key")}
        done = relay(tmp_path, "install", "--url", other.url, "--dry-run", stdin="", **by_env)
        assert done.returncode == 0, done.stderr
        assert other.requests[-1].headers["authorization"] == f"Bearer {chosen}"
        # ... and said to be that file's, not "the one installed" (review)
        assert "Key: from RELAY_API_KEY_FILE (--key or --key-file to change it)" in done.stdout
        # The installed server, spelled with a slash, still gets the installed key.
        done = relay(tmp_path, "install", "--url", installed.url + "/", "--dry-run", stdin="")
        assert done.returncode == 0, done.stderr
        assert [r.headers["authorization"] for r in installed.requests] == [f"Bearer {key}"]


def test_without_a_terminal_install_names_the_flags_it_would_have_asked_for(tmp_path, server):
    """QA: `relay install < /dev/null` said `Relay server URL [...]: aborted` and no reason;
    with a key piped in, Python's GetPassWarning and "Password input may be echoed"."""
    home = tmp_path / "home"
    home.mkdir()
    null = subprocess.run(
        [RELAY, "install"],
        env=clean_env(home),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert null.returncode == 2 and null.stdout == "", null.stdout
    assert null.stderr == (
        "relay: error: no terminal to ask on and nothing installed to reuse: pass --url URL and"
        " --key KEY (or --key-file FILE) (see 'relay install --help')\n"
    )
    piped = relay(home, "install", "--url", server["url"], stdin=server["key"] + "\n")
    assert piped.returncode == 2 and piped.stdout == "", piped.stdout
    assert piped.stderr == (
        "relay: error: no terminal to ask on and nothing installed to reuse: pass --key KEY (or"
        " --key-file FILE) (see 'relay install --help')\n"
    )
    assert snapshot(home) == {}


@pytest.mark.parametrize("project", [False, True])
def test_uninstall_refuses_a_settings_file_it_cannot_read_and_changes_nothing(
    tmp_path, server, project
):
    """QA: with ~/.claude/settings.json no longer JSON, uninstall left Relay's hooks in it,
    removed the rest and the record a second run needs, printed "Relay is no longer wired
    into the agents on this machine." with exit 0, and its warning said to run `relay
    install` again."""
    home = tmp_path / "home"
    home.mkdir()
    args: tuple[str, ...] = ()
    if project:
        (tmp_path / "p").mkdir()
        args = ("--project", str(tmp_path / "p"))
    assert install(home, server, *args).returncode == 0
    settings = (tmp_path / "p/.claude" if project else home / ".claude") / "settings.json"
    with settings.open("a") as f:
        f.write("{broken\n")
    before = snapshot(tmp_path)
    done = relay(home, "uninstall", *args)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    command = f"uninstall --project {tmp_path / 'p'}" if project else "uninstall"
    shown = str(settings) if project else "~/.claude/settings.json"
    assert done.stderr.startswith(
        f"relay: error: {command} cannot take the Relay hooks out of {shown}, so Relay is still"
        f" wired in: {settings} is not valid JSON (Extra data: "
    ), done.stderr
    assert done.stderr.endswith(
        f"; fix or move it, then run relay {command} again. Nothing was changed\n"
    ), done.stderr
    assert snapshot(tmp_path) == before
    settings.write_text(settings.read_text().replace("{broken\n", ""))
    again = relay(home, "uninstall", *args)
    assert again.returncode == 0, again.stderr
    assert "settings.json  (Relay hooks)" in again.stdout
