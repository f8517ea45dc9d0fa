"""`relay doctor` on a healthy install, a revoked key, a stopped server, a server whose
database is down and a missing hook."""

from __future__ import annotations

import json
import os
import re
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import start_server
from hook_support import free_port
from integration_support import (
    BIN,
    mint,
    old_script,
    registered_command,
    relay,
    revoke,
    run_registered,
    start_module_server,
    stop_server,
    wait_healthy,
)
from postgres_support import PrivatePostgres


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    live = start_module_server(tmp_path_factory, "doctor")
    yield live
    stop_server(live)


def installed(home, url: str, key: str) -> None:
    done = relay(home, "install", "--url", url, "--key", key)
    assert done.returncode == 0, done.stderr


def doctor(home, **env: str):
    return relay(home, "doctor", **env)


def findings(home, **env: str) -> list[dict]:
    done = relay(home, "doctor", "--json", **env)
    return json.loads(done.stdout)


def failures(home) -> list[str]:
    return [f"{f['area']}: {f['message']}" for f in findings(home) if f["level"] == "fail"]


def prompt(home, text: str = "how do we deploy the billing service to staging?", session="doc"):
    command = registered_command(home / ".claude/settings.json", "UserPromptSubmit")
    run = run_registered(
        command,
        home,
        {
            "session_id": session,
            "prompt_id": "p",
            "hook_event_name": "UserPromptSubmit",
            "prompt": text,
        },
    )
    assert run.returncode == 0


def test_healthy_install(tmp_path, server):
    key = mint(server.url, server.admin_key, "doctor-healthy", ["memory:read"])
    installed(tmp_path, server.url, key["secret"])
    prompt(tmp_path)
    done = doctor(tmp_path)
    assert done.returncode == 0, done.stdout
    out = done.stdout
    assert "Recall is wired up" in out and "FAIL" not in out
    assert f"{server.url} answers /healthz in" in out
    assert f"key {key['id']} of organisation acme: scopes memory:read; roles none" in out
    assert "read-only key" in out
    assert "Claude Code: UserPromptSubmit and SessionStart in ~/.claude/settings.json" in out
    assert "Codex: UserPromptSubmit and SessionStart in ~/.codex/hooks.json" in out
    assert "MCP server `relay`" in out
    assert "last 24 h: 1 runs" in out and "p95 hook time" in out


def test_revoked_key(tmp_path, server):
    key = mint(server.url, server.admin_key, "doctor-revoked", ["memory:read"])
    installed(tmp_path, server.url, key["secret"])
    revoke(server.url, server.admin_key, key["id"])
    prompt(tmp_path)
    prompt(tmp_path, "and how do we roll back the billing service in production?", "doc-2")
    done = doctor(tmp_path)
    assert done.returncode == 1
    assert "this API key was revoked" in done.stdout
    assert "relay install --key-file FILE" in done.stdout
    failed = failures(tmp_path)
    assert any(f.startswith("key: the server rejects the key") for f in failed)
    assert any(f.startswith("log: the last 2 searches were rejected (401/403)") for f in failed)


def test_rejections_before_a_new_key_get_no_fix(tmp_path, server):
    """QA: after a good key was installed, the warning of rejected searches said the key
    works now, and still gave the fix `install a valid key`; they were the old key's, which
    the log now names, so they are no warning about the new one at all."""
    key = mint(server.url, server.admin_key, "doctor-replaced", ["memory:read"])
    installed(tmp_path, server.url, key["secret"])
    revoke(server.url, server.admin_key, key["id"])
    prompt(tmp_path)
    installed(tmp_path, server.url, server.admin_key)
    (log,) = [f for f in findings(tmp_path) if "rejected (401/403)" in f["message"]]
    admin_id = server.admin_key.split("_")[1]
    assert log["level"] == "ok", log
    assert log["message"].startswith(
        f"key {key['id']} was rejected (401/403) on the last search since "
    ) and log["message"].endswith(
        f"; it is not the configured key {admin_id}, which the next prompt sends"
    ), log
    assert log["fix"] == ""


def test_rejections_of_a_key_the_agents_environment_set_are_that_keys(tmp_path, server):
    """QA: prompts run with RELAY_API_KEY exported (a stale key) in place of the installed
    one were rejected, and doctor said the installed key's searches were."""
    good = mint(server.url, server.admin_key, "doctor-env-good", ["memory:read"])
    stale = mint(server.url, server.admin_key, "doctor-env-stale", ["memory:read"])
    revoke(server.url, server.admin_key, stale["id"])
    installed(tmp_path, server.url, good["secret"])
    command = registered_command(tmp_path / ".claude/settings.json", "UserPromptSubmit")
    for session in ("env-1", "env-2"):
        payload = {
            "session_id": session,
            "prompt_id": "p",
            "hook_event_name": "UserPromptSubmit",
            "prompt": "how do we deploy the billing service to staging?",
        }
        done = run_registered(
            command, tmp_path, payload, extra_env={"RELAY_API_KEY": stale["secret"]}
        )
        assert done.returncode == 0
    (log,) = [f for f in findings(tmp_path) if "rejected (401/403)" in f["message"]]
    assert log["level"] == "warn", log
    assert log["message"].startswith(
        f"key {stale['id']}, which RELAY_API_KEY in an agent's environment set in place of the"
        f" configured key {good['id']}, was rejected (401/403) on the last 2 searches since "
    ), log
    assert "relay install" not in log["fix"]


def test_stopped_server(tmp_path, tmp_path_factory):
    own = start_module_server(tmp_path_factory, "doctor-stopped")
    installed(tmp_path, own.url, own.admin_key)
    stop_server(own)
    prompt(tmp_path)
    done = doctor(tmp_path)
    assert done.returncode == 1
    assert f"cannot reach the Relay server at {own.url}" in done.stdout
    assert "fix: start the server" in done.stdout
    log = json.loads((tmp_path / ".relay/state/outcomes.jsonl").read_text().splitlines()[-1])
    assert log["outcome"] == "unavailable"


@pytest.mark.postgres
def test_server_up_but_its_database_down(tmp_path):
    pg = PrivatePostgres()
    own = start_server(pg.url)  # type: ignore[arg-type]  (a URL where a path usually goes)
    try:
        wait_healthy(own, 30)
        installed(tmp_path, own.url, own.admin_key)
        pg.stop()
        done = doctor(tmp_path)
    finally:
        stop_server(own)
        pg.close()
    assert done.returncode == 1
    assert f"the server at {own.url} answers, but its database is unreachable" in done.stdout
    assert "fix: check the server's database: is PostgreSQL up" in done.stdout
    assert "fix: start the server" not in done.stdout


def test_missing_hook(tmp_path, server):
    installed(tmp_path, server.url, server.admin_key)
    settings = tmp_path / ".claude/settings.json"
    doc = json.loads(settings.read_text())
    del doc["hooks"]["UserPromptSubmit"]
    settings.write_text(json.dumps(doc))
    done = doctor(tmp_path)
    assert done.returncode == 1
    assert "Claude Code: ~/.claude/settings.json lacks the UserPromptSubmit hook" in done.stdout
    assert "fix: run `relay install --agent claude-code`" in done.stdout
    (tmp_path / ".codex/hooks.json").write_text("{}")
    assert any("Codex: no Relay hooks in ~/.codex/hooks.json" in f for f in failures(tmp_path))


def test_deleted_script_and_a_moved_relay(tmp_path, server):
    installed(tmp_path, server.url, server.admin_key)
    script = tmp_path / ".relay/relay-autosearch-hook.sh"
    original = script.read_text()
    script.unlink()
    done = doctor(tmp_path)
    assert done.returncode == 0  # deleting the script is how a user turns recall off
    assert "automatic recall is off" in done.stdout
    script.write_text(original.replace("/relay-hook", "/moved-away/relay-hook"))
    script.chmod(0o700)
    done = doctor(tmp_path)
    assert done.returncode == 1, done.stdout
    assert (
        "relay-hook, which does not exist or is not executable: recall is silently off on "
        "every prompt (exit status 0, nothing shown)"
    ) in done.stdout
    # The knobs' end marker deleted: the rest of the file, the exec included, is knobs.
    script.write_text(original.replace("\nKNOBS\n", "\n"))
    done = doctor(tmp_path)
    assert done.returncode == 1, done.stdout
    assert (
        "~/.relay/relay-autosearch-hook.sh has no `KNOBS` line to end its knobs: the script "
        "reads the rest of the file, its `exec` of relay-hook included, as knobs, so recall "
        "is silently off"
    ) in done.stdout


def test_a_hook_naming_another_homes_script_fails_and_install_fixes_it(tmp_path, server):
    """QA: settings copied from elsewhere ran /home/olduser/.relay/relay-autosearch-hook.sh
    while this HOME's script was there, and doctor only warned, as for the documented off
    switch (deleting this HOME's script), and said recall was wired up."""
    installed(tmp_path, server.url, server.admin_key)
    settings = tmp_path / ".claude/settings.json"
    foreign = "/home/olduser/.relay/relay-autosearch-hook.sh"
    settings.write_text(
        settings.read_text().replace(f"{tmp_path}/.relay/", "/home/olduser/.relay/")
    )
    assert foreign in registered_command(settings, "UserPromptSubmit")
    done = doctor(tmp_path)
    assert done.returncode == 1, done.stdout
    assert failures(tmp_path) == [
        f"hooks: Claude Code: ~/.claude/settings.json runs {foreign}, which does not exist or "
        "is not executable, instead of this HOME's ~/.relay/relay-autosearch-hook.sh (settings "
        "copied from another machine or user?): automatic recall is off (the agent skips it "
        "silently)"
    ]
    assert "fix: run `relay install`: it registers ~/.relay/relay-autosearch-hook.sh" in (
        done.stdout
    )
    assert relay(tmp_path, "install").returncode == 0  # the fix it gives clears it
    assert failures(tmp_path) == []
    assert f"{tmp_path}/.relay/" in registered_command(settings, "UserPromptSubmit")


def test_a_hook_running_another_homes_working_script_is_named(tmp_path, server):
    """QA: an entry running another HOME's script that exists and runs passed with 0
    warnings, though this HOME's knobs and its off switch (deleting ~/.relay's script) do
    not reach it; the same script named through a link to this HOME's folder is this one."""
    home, other = tmp_path / "me", tmp_path / "other"
    installed(home, server.url, server.admin_key)
    installed(other, server.url, server.admin_key)
    settings = home / ".claude/settings.json"
    foreign = other / ".relay/relay-autosearch-hook.sh"
    settings.write_text(settings.read_text().replace(f"{home}/.relay/", f"{other}/.relay/"))
    assert str(foreign) in registered_command(settings, "UserPromptSubmit")
    done = doctor(home)
    assert done.returncode == 0, done.stdout
    assert "Recall is wired up. 1 warning(s)." in done.stdout
    (warned,) = [f for f in findings(home) if f["level"] != "ok"]
    assert (warned["level"], warned["area"], warned["message"], warned["fix"]) == (
        "warn",
        "hooks",
        f"Claude Code: ~/.claude/settings.json runs {foreign}, not this HOME's "
        "~/.relay/relay-autosearch-hook.sh (settings copied from another machine or user?): "
        "the agent runs with that script's knobs (and any key or config they name); editing "
        "the knobs in ~/.relay/relay-autosearch-hook.sh, or deleting it to turn recall off, "
        "does not reach it",
        "run `relay install`: it registers ~/.relay/relay-autosearch-hook.sh instead",
    )
    assert relay(home, "install").returncode == 0  # the fix it gives clears it
    assert "0 warning(s)" in doctor(home).stdout
    # This HOME's script by another name (a link to its folder) is this HOME's.
    (home / "linked").symlink_to(home / ".relay")
    settings.write_text(settings.read_text().replace(f"{home}/.relay/", f"{home}/linked/"))
    assert f"{home}/linked/" in registered_command(settings, "UserPromptSubmit")
    done = doctor(home)
    assert done.returncode == 0 and "0 warning(s)" in done.stdout, done.stdout


def test_no_install_at_all(tmp_path):
    done = doctor(tmp_path)
    assert done.returncode == 1
    assert "no Relay config at ~/.relay/config.json" in done.stdout
    assert "relay install" in done.stdout
    # QA: it said `ok log no prompts...`, as if all were well but unused
    (log,) = [f for f in findings(tmp_path) if f["area"] == "log"]
    assert log["level"] == "warn", log
    assert log["message"] == (
        "no prompts logged in the last 24 hours, and none will be: no agent has Relay's hook "
        "registered (see hooks above)"
    )


def test_a_relay_config_that_is_not_json_is_named_as_such(tmp_path, server):
    """QA: for a broken ~/.relay/config.json the CLI said 'no server URL ... run relay
    install' (the hook's side: test_hook_faults, `bad_config`)."""
    installed(tmp_path, server.url, server.admin_key)
    config = tmp_path / ".relay/config.json"
    config.write_text(config.read_text().replace('",', '"', 1))  # a comma lost in an edit
    done = relay(tmp_path, "search", "how do we deploy?")
    assert done.returncode != 0 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"relay: error: {config} is not valid JSON (line "), line
    assert "column" in line and line.endswith("fix the file") and "install" not in line
    assert any("config.json cannot be read as JSON" in f for f in failures(tmp_path))
    # with the server and key given, the broken file is not in the way
    done = relay(tmp_path, "search", "how do we deploy?", RELAY_URL=server.url)
    assert "not valid JSON" in done.stderr  # the key was in the file
    key = {"RELAY_URL": server.url, "RELAY_API_KEY": server.admin_key}
    assert relay(tmp_path, "search", "how do we deploy?", **key).returncode == 0


def test_a_config_saved_with_a_byte_order_mark_is_read_as_the_hook_reads_it(tmp_path, server):
    """QA: a ~/.relay/config.json saved by Notepad (a UTF-8 byte-order mark first), which the
    hook and the CLI read, failed doctor with "cannot be read as JSON ... the hook ignores
    it": doctor parsed it a second time, by json.loads, which refuses the mark."""
    installed(tmp_path, server.url, server.admin_key)
    config = tmp_path / ".relay/config.json"
    config.write_bytes(b"\xef\xbb\xbf" + config.read_bytes())
    assert relay(tmp_path, "search", "how do we deploy?").returncode == 0
    assert [f for f in failures(tmp_path) if "config" in f] == []


def test_a_config_the_hook_refuses_is_named_as_doctor_reads_it(tmp_path, server):
    """Reviewer: doctor parsed config.json by json.loads, which takes NaN, and then said "no
    server URL configured: run relay install" for a file the hook logs as bad_config."""
    installed(tmp_path, server.url, server.admin_key)
    config = tmp_path / ".relay/config.json"
    doc = json.loads(config.read_text())
    config.write_text(json.dumps({**doc, "max_records": float("nan")}))
    (failure,) = [f for f in failures(tmp_path) if "config" in f]
    assert "config.json cannot be read as JSON" in failure and "NaN is not JSON" in failure


def test_an_inline_key_beside_a_missing_key_file_is_the_key(tmp_path, server):
    """Reviewer: api_key in config.json (which the hook takes first) with api_key_file naming
    a file that is gone crashed doctor with a traceback at the key file's mode."""
    installed(tmp_path, server.url, server.admin_key)
    config = tmp_path / ".relay/config.json"
    doc = json.loads(config.read_text())
    doc.update(api_key=server.admin_key, api_key_file=str(tmp_path / "gone.key"))
    config.write_text(json.dumps(doc))
    done = relay(tmp_path, "doctor")
    assert "Traceback" not in done.stderr, done.stderr
    assert "key from api_key in ~/.relay/config.json" in done.stdout
    done = relay(tmp_path, "doctor", RELAY_API_KEY=server.admin_key)
    assert "key from RELAY_API_KEY" in done.stdout


def test_the_key_is_where_the_hook_finds_it(tmp_path, server):
    """doctor named the key's source by a copy of the hook's rule, which took an empty
    RELAY_API_KEY for no setting: the hook takes it as an empty api_key, and so reads the
    key file config.json names, here one others can read, which doctor never checked."""
    installed(tmp_path, server.url, server.admin_key)
    config = tmp_path / ".relay/config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "api_key": "relay_x_y"}))
    (tmp_path / ".relay/key").chmod(0o644)
    done = relay(tmp_path, "doctor", RELAY_API_KEY="")
    assert f"server {server.url}, key from ~/.relay/key" in done.stdout, done.stdout
    assert "the key file ~/.relay/key is readable by others (mode 644)" in done.stdout
    assert done.returncode == 0, done.stdout  # the key the hook sends is the file's: it works


def test_a_codex_config_that_is_not_toml_fails(tmp_path, server):
    """QA: with a broken ~/.codex/config.toml doctor said `ok` for the Codex hooks, warned
    that the MCP server was gone and advised `relay install`, which then refused the file;
    the summary read "Recall is wired up". Codex cannot start with such a file."""
    installed(tmp_path, server.url, server.admin_key)
    config = tmp_path / ".codex/config.toml"
    config.write_text(config.read_text() + 'model = "gpt-5\n')
    done = doctor(tmp_path)
    assert done.returncode == 1, done.stdout
    assert "Recall is wired up" not in done.stdout
    failed = failures(tmp_path)
    broken = [f for f in failed if "~/.codex/config.toml is not valid TOML" in f]
    assert len(broken) == 1 and "(at line " in broken[0], failed
    assert "trust the two Relay hooks" not in done.stdout
    assert "no longer in ~/.codex/config.toml" not in done.stdout
    assert "fix: fix the file, then `relay install`" in done.stdout


def test_a_claude_json_that_is_not_json_fails(tmp_path, server):
    installed(tmp_path, server.url, server.admin_key)
    claude_json = tmp_path / ".claude.json"
    claude_json.write_text(claude_json.read_text()[:-3])
    done = doctor(tmp_path)
    assert done.returncode == 1, done.stdout
    assert any("~/.claude.json is not valid JSON" in f for f in failures(tmp_path))
    assert "no longer in ~/.claude.json" not in done.stdout


def test_an_unreadable_settings_file_of_an_agent_relay_is_not_installed_for_only_warns(
    tmp_path, server
):
    """QA: `relay install --agent codex`, as a user whose ~/.claude/settings.json holds
    comments (which install refuses) installs, then doctor failed with "1 problem(s) break
    recall" and exit 1 over Claude Code's file, while Codex's recall was sound."""
    settings = tmp_path / ".claude/settings.json"
    settings.parent.mkdir()
    settings.write_text('{\n  // mine\n  "model": "opus"\n}\n')
    done = relay(tmp_path, "install", "--url", server.url, "--key", server.admin_key)
    assert done.returncode == 2 and "holds a comment (line 2)" in done.stderr
    assert "To install for Codex alone meanwhile: relay install --agent codex" in done.stderr
    done = relay(
        tmp_path, "install", "--url", server.url, "--key", server.admin_key, "--agent", "codex"
    )
    assert done.returncode == 0, done.stderr
    done = doctor(tmp_path)
    assert done.returncode == 0, done.stdout
    assert "Recall is wired up. 1 warning(s)." in done.stdout
    (warning,) = [f for f in findings(tmp_path) if f["level"] == "warn"]
    assert warning["message"].startswith(
        f"Claude Code: ~/.claude/settings.json is unreadable ({settings} holds a comment (line 2),"
    )
    assert warning["message"].endswith(
        "Claude Code ignores all of it, and Relay installed no hooks there"
    )
    # doctor changes nothing: install's "then run relay install again. Nothing was changed"
    # read as if doctor had refused something (QA)
    assert "Nothing was changed" not in warning["message"], warning["message"]
    assert "run relay install again" not in warning["message"], warning["message"]
    assert warning["fix"] == (
        "fix the file, then `relay install --agent claude-code` for recall in Claude Code"
    )


def test_a_breaker_left_by_another_url_is_not_reported(tmp_path, server):
    """QA: prompts run with RELAY_URL pointing elsewhere opened the breaker for that URL;
    doctor warned that the hook's breaker was open, though the hook ignores that state."""
    installed(tmp_path, server.url, server.admin_key)
    command = registered_command(tmp_path / ".claude/settings.json", "UserPromptSubmit")
    elsewhere = f"http://127.0.0.1:{free_port()}"  # nothing listens: unavailable at once
    for n in range(3):
        payload = {
            "session_id": f"elsewhere-{n}",
            "prompt_id": "p",
            "hook_event_name": "UserPromptSubmit",
            "prompt": "how do we deploy the billing service to staging?",
        }
        # with a key of its own: the installed one is not sent to another server
        own = {"RELAY_URL": elsewhere, "RELAY_API_KEY_FILE": str(tmp_path / ".relay/key")}
        run_registered(command, tmp_path, payload, extra_env=own)
    breaker = json.loads((tmp_path / ".relay/state/breaker.json").read_text())
    assert breaker["url"] == elsewhere and breaker["opened_at"]
    done = doctor(tmp_path)
    assert "circuit breaker" not in done.stdout, done.stdout


def test_a_state_folder_the_hook_cannot_write_fails_and_its_prompts_are_counted(tmp_path, server):
    """QA: with ~/.relay/state unusable (`mv ~/.relay/state ~/.relay/state.bak; echo x >
    ~/.relay/state`, as root-owned after `sudo claude`), recall went quiet for every
    session, doctor said "wired up, 0 warnings" and relay stats counted 0 prompts."""
    installed(tmp_path, server.url, server.admin_key)
    state = tmp_path / ".relay/state"
    if state.exists():
        state.rename(tmp_path / ".relay/state.bak")
    state.write_text("x\n")
    temp = tmp_path / "tmp"
    temp.mkdir()
    command = registered_command(tmp_path / ".claude/settings.json", "UserPromptSubmit")
    payload = {
        "session_id": "sudo-left",
        "prompt_id": "p",
        "hook_event_name": "UserPromptSubmit",
        "prompt": "how do we deploy the billing service to staging?",
    }
    # The hook of this checkout (a worktree's tests set PYTHONPATH), with its temporary folder.
    env = {"TMPDIR": str(temp), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    run = run_registered(command, tmp_path, payload, extra_env=env)
    assert run.returncode == 0, run
    done = doctor(tmp_path, TMPDIR=str(temp))
    assert done.returncode == 1, done.stdout
    (finding,) = [f for f in findings(tmp_path, TMPDIR=str(temp)) if f["area"] == "state"]
    assert finding["level"] == "fail"
    assert finding["message"].startswith(
        "the hook's state folder ~/.relay/state cannot be made: ~/.relay/state is not a folder:"
    ), finding
    assert finding["fix"] == "move it aside (`mv ~/.relay/state ~/.relay/state.bak`); " + (
        "the hook makes a new folder"
    )
    assert "last 24 h: 1 runs, 0 hits, 1 no match" in done.stdout  # it searched
    stats = json.loads(relay(tmp_path, "stats", "--json", TMPDIR=str(temp)).stdout)
    assert stats["invocations"] == 1 and stats["outcomes"]["no_match"] == 1
    assert stats["state_errors"] == {"Not a directory": 1}
    (said,) = [p for p in stats["problems"] if "could not write the hook's state folder" in p]
    assert said.startswith("1 run could not write") and "(Not a directory: 1 run)" in said
    state.unlink()
    assert not [f for f in findings(tmp_path, TMPDIR=str(temp)) if f["area"] == "state"]


def test_a_state_folder_that_takes_no_more_bytes_fails(tmp_path, server):
    """QA: on a full disk the hook could not write its state (stats said so, and that
    doctor says how to fix it), while doctor's probe, an empty file, was still made: "Recall
    is wired up". A file size limit of 0 is a disk that takes files but no bytes."""
    import errno
    import resource
    import subprocess

    from integration_support import RELAY, clean_env

    installed(tmp_path, server.url, server.admin_key)
    (tmp_path / ".relay/state").mkdir(exist_ok=True)
    done = subprocess.run(
        [RELAY, "doctor", "--json"],
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0)),
    )
    (finding,) = [f for f in json.loads(done.stdout) if f["area"] == "state"]
    assert finding["level"] == "fail"
    assert finding["message"].startswith(
        f"the hook cannot write its state folder ~/.relay/state ({os.strerror(errno.EFBIG)}):"
    ), finding


def test_a_relative_state_folder_does_not_hang_doctor(tmp_path, server):
    """Review: with RELAY_STATE_DIR=relstate, doctor looked for the nearest folder there
    by climbing "relstate" to "", whose parent is "" again, and never finished."""
    import subprocess

    from integration_support import RELAY, clean_env

    installed(tmp_path, server.url, server.admin_key)
    env = clean_env(tmp_path, RELAY_STATE_DIR="relstate")
    args = [RELAY, "doctor", "--json"]
    done = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stdout
    assert not [f for f in json.loads(done.stdout) if f["area"] == "state"]
    (tmp_path / "relstate").write_text("x\n")  # then it is named as any other
    done = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, timeout=60)
    (finding,) = [f for f in json.loads(done.stdout) if f["area"] == "state"]
    assert "relstate is not a folder" in finding["message"], finding


def test_state_files_another_user_owns_are_named(tmp_path, server):
    """Files `sudo claude` left in a state folder this user can still write: the sessions
    they hold get no state, and a log or breaker among them is not written."""
    installed(tmp_path, server.url, server.admin_key)
    sessions = tmp_path / ".relay/state/sessions"
    sessions.mkdir(parents=True, exist_ok=True)
    (sessions / "root-made.lock").write_text("")
    os.chown(sessions / "root-made.lock", 65534, 65534)
    (finding,) = [f for f in findings(tmp_path) if f["area"] == "state"]
    assert finding["level"] == "warn"
    assert finding["message"].startswith(
        "1 files in the hook's state folder ~/.relay/state belong to another user (e.g. "
        "~/.relay/state/sessions/root-made.lock)"
    ), finding
    assert finding["fix"].startswith("`sudo chown -R ")


def test_a_deadline_this_machine_cannot_search_in_fails(tmp_path, server):
    """QA: with a deadline too short, every prompt ran out of budget before its request
    (`timeout`, `no_budget_left`) and nothing said so; doctor reads it from the log."""
    installed(tmp_path, server.url, server.admin_key)
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    entry = {"ts": now, "event": "prompt", "outcome": "timeout", "reason": "no_budget_left"}
    log = tmp_path / ".relay/state/outcomes.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text((json.dumps({**entry, "ms": {"total": 60}}) + "\n") * 6)
    done = doctor(tmp_path)
    assert done.returncode == 1, done.stdout
    assert any(
        f.startswith("log: 6 runs in the last 24 h ran out of budget before they could search")
        for f in failures(tmp_path)
    )
    assert "fix: raise DEADLINE_MS in ~/.relay/relay-autosearch-hook.sh" in done.stdout


def test_doctor_reads_the_settings_the_hook_runs_with(tmp_path, server):
    """QA (session 7): doctor showed the config file's deadline, though the hook script's
    DEADLINE_MS, which the agents run, beats it (an environment variable beats both)."""
    installed(tmp_path, server.url, server.admin_key)
    script = tmp_path / ".relay/relay-autosearch-hook.sh"
    script.write_text(script.read_text().replace("DEADLINE_MS=400", "DEADLINE_MS=900"))
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    log = tmp_path / ".relay/state/outcomes.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text(json.dumps({"ts": now, "outcome": "hit", "ms": {"total": 40}}) + "\n")
    assert "(deadline 900 ms)" in doctor(tmp_path).stdout
    assert "(deadline 700 ms)" in doctor(tmp_path, RELAY_DEADLINE_MS="700").stdout


def test_doctor_says_which_knobs_the_hook_ignores(tmp_path, server):
    """QA (session 7): DEADLINE_MS=50 in the hook script, or a min_score of "high" in
    config.json, is ignored by the hook (it falls back to the layer below), and doctor said
    nothing of it."""
    installed(tmp_path, server.url, server.admin_key)
    script = tmp_path / ".relay/relay-autosearch-hook.sh"
    text = script.read_text().replace("DEADLINE_MS=400", "DEADLINE_MS=50")
    script.write_text(text)
    config = tmp_path / ".relay/config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "min_score": "high"}))
    warned = [f["message"] for f in findings(tmp_path) if f["level"] == "warn"]
    number = text.splitlines().index("DEADLINE_MS=50") + 1
    assert [m for m in warned if "deadline_ms" in m] == [  # once, where to fix it
        f"the hook ignores deadline_ms '50' from line {number}"
        " of ~/.relay/relay-autosearch-hook.sh, `DEADLINE_MS=50` (outside 100..10000), and "
        "takes config.json's value or its default"
    ], warned
    assert any(m.startswith("the hook ignores min_score 'high'") for m in warned), warned
    fixes = [f["fix"] for f in findings(tmp_path) if "deadline_ms '50'" in f["message"]]
    assert fixes == [  # QA: it was the fix for a comment after the value
        "set DEADLINE_MS to a value in 100..10000, or run `relay install` to rewrite the script "
        "(knobs back to their defaults)"
    ]


def test_an_ignored_config_value_is_told_with_the_value_the_hook_runs_with(tmp_path, server):
    """QA: deadline_ms 50 in config.json (out of range) while the script sets DEADLINE_MS=400:
    doctor said the hook 'uses the value below it', but it runs with the script's 400, from
    above; a value with nothing above it falls to its default, said with that default."""
    installed(tmp_path, server.url, server.admin_key)
    config = tmp_path / ".relay/config.json"
    config.write_text(
        json.dumps({**json.loads(config.read_text()), "deadline_ms": 50, "min_score": "high"})
    )
    warned = {
        m.split(" (", 1)[0].split(" ")[3]: m
        for f in findings(tmp_path)
        if (m := f["message"]).startswith("the hook ignores")
    }
    assert warned["deadline_ms"].endswith(
        "and runs with 400 from ~/.relay/relay-autosearch-hook.sh (docs/hook.md)"
    ), warned
    assert warned["min_score"].endswith("and runs with its default, 0.2 (docs/hook.md)"), warned


def test_a_number_written_loosely_is_named_as_a_value_the_hook_ignores(tmp_path, server):
    """QA: RELAY_DEADLINE_MS=4_00 was taken as 400 (int() reads underscores). The hook now
    ignores such a value, as any bad one; doctor names it with its value, where it is, and
    what the hook runs with instead."""
    installed(tmp_path, server.url, server.admin_key)
    config = tmp_path / ".relay/config.json"
    loose = {"max_records": "1_0", "min_score": " 0.5"}
    config.write_text(json.dumps({**json.loads(config.read_text()), **loose}))
    warned = [
        m
        for f in findings(tmp_path, RELAY_LOG_KEEP="+3")
        if (m := f["message"]).startswith("the hook ignores")
    ]
    assert warned == [  # in the order of the settings table (docs/hook.md)
        f"the hook ignores min_score ' 0.5' in {config} (not a number) and runs with its"
        " default, 0.2 (docs/hook.md)",
        f"the hook ignores max_records '1_0' in {config} (not a whole number) and runs with"
        " its default, 3 (docs/hook.md)",
        "the hook ignores log_keep '+3' in RELAY_LOG_KEEP (not a whole number) and runs with"
        " its default, 3 (docs/hook.md)",
    ], warned


def test_a_token_budget_claude_code_would_cut_is_named_with_why(tmp_path, server):
    """QA: profile_max_tokens=8000 was accepted, and a SessionStart context of 23,986
    characters went to Claude Code, which keeps 10,000 and shows the model a preview."""
    installed(tmp_path, server.url, server.admin_key)
    config = tmp_path / ".relay/config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "profile_max_tokens": 8000}))
    (finding,) = [f for f in findings(tmp_path) if "profile_max_tokens" in f["message"]]
    assert finding["level"] == "warn"
    assert finding["message"] == (  # capped, not the default of 800 (review)
        f"the hook caps profile_max_tokens 8000 in {config} at 3000 (Claude Code cuts hook"
        " output over 10,000 characters to a 2,000-character preview, so the hook never"
        " prints more than 9,500, about 3000 tokens)"
    ), finding


def test_knob_lines_the_script_cannot_use_are_named(tmp_path, server):
    """A knob line is data to the script now: a name it does not know sets nothing, and a
    comment after a value is part of the value, which the hook then ignores."""
    installed(tmp_path, server.url, server.admin_key)
    script = tmp_path / ".relay/relay-autosearch-hook.sh"
    text = script.read_text().replace("DEADLINE_MS=400", "DEADLIN_MS=900")
    text = text.replace("MIN_PROMPT_LEN=15", "MIN_PROMPT_LEN=20  # longer prompts only")
    script.write_text(text)
    config = tmp_path / ".relay/config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "deadline_ms": 700}))
    lines = text.splitlines()
    done = doctor(tmp_path)
    assert done.returncode == 0, done.stdout
    warned = [f["message"] for f in findings(tmp_path) if f["level"] == "warn"]
    assert warned[:2] == [
        f"the hook ignores min_prompt_len '20  # longer prompts only' from line "
        f"{lines.index('MIN_PROMPT_LEN=20  # longer prompts only') + 1} of "
        "~/.relay/relay-autosearch-hook.sh, `MIN_PROMPT_LEN=20  # longer prompts only` (not a "
        "whole number), and takes config.json's value or its default",
        f"line {lines.index('DEADLIN_MS=900') + 1} of ~/.relay/relay-autosearch-hook.sh, "
        "`DEADLIN_MS=900`, sets nothing: the script reads only THROTTLE_PROMPTS, "
        "OVERLAP_THRESHOLD, MIN_PROMPT_LEN and DEADLINE_MS",
    ], warned
    assert "fix: write it as DEADLINE_MS=900" in done.stdout
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    log = tmp_path / ".relay/state/outcomes.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(json.dumps({"ts": now, "outcome": "hit", "ms": {"total": 40}}) + "\n")
    assert "(deadline 700 ms)" in doctor(tmp_path).stdout  # config.json's: no DEADLINE_MS line


def test_an_install_without_mcp_is_not_told_to_install_it(tmp_path, server):
    """QA (session 7): after `relay install --no-mcp`, doctor warned that the MCP server
    was 'no longer' in ~/.codex/config.toml and told the user to run relay install."""
    done = relay(tmp_path, "install", "--url", server.url, "--key", server.admin_key, "--no-mcp")
    assert done.returncode == 0, done.stderr
    assert not [f for f in findings(tmp_path) if f["area"] == "mcp" and f["level"] != "ok"]


def registered_by_hand(home, url: str, key: str) -> dict:
    """Relay set up as docs/hook.md shows, without `relay install`: a config file, a key
    file, and `relay-hook` itself registered in ~/.claude/settings.json."""
    relay_dir = home / ".relay"
    relay_dir.mkdir(mode=0o700)
    (relay_dir / "key").write_text(key + "\n")
    (relay_dir / "key").chmod(0o600)
    config = {"url": url, "api_key_file": str(relay_dir / "key")}
    (relay_dir / "config.json").write_text(json.dumps(config))
    hook = str(BIN / "relay-hook")
    settings = {
        "hooks": {
            "UserPromptSubmit": [{"hooks": [{"type": "command", "command": hook}]}],
            "SessionStart": [{"hooks": [{"type": "command", "command": f"{hook} session-start"}]}],
        }
    }
    (home / ".claude").mkdir()
    (home / ".claude/settings.json").write_text(json.dumps(settings))
    return settings


def test_a_hook_registered_by_hand_is_checked_and_not_doubled(tmp_path, server):
    """QA: `relay-hook` registered by hand as docs/hook.md shows was invisible to doctor
    (FAIL: no Relay hooks, though the log counted its hits), and `relay install` added a
    second pair, so the hook ran twice per prompt."""
    registered_by_hand(tmp_path, server.url, server.admin_key)
    settings = tmp_path / ".claude/settings.json"
    run = run_registered(
        str(BIN / "relay-hook"),
        tmp_path,
        {"session_id": "hand", "prompt_id": "p", "prompt": "how do we deploy billing to staging?"},
    )
    assert run.returncode == 0
    done = doctor(tmp_path)
    assert done.returncode == 0, done.stdout
    assert (
        "Claude Code: UserPromptSubmit and SessionStart in ~/.claude/settings.json -> "
        f"{BIN / 'relay-hook'} (started directly, without the knob script" in done.stdout
    )
    assert "last 24 h: 1 runs" in done.stdout
    by_hand = settings.read_bytes()
    installed(tmp_path, server.url, server.admin_key)
    commands = json.loads(settings.read_text())["hooks"]
    assert [len(commands[event]) for event in ("UserPromptSubmit", "SessionStart")] == [1, 1]
    registered_command(settings, "UserPromptSubmit")  # install's, through the knob script
    # and uninstall gives the hand registration back, as every original comes back
    assert relay(tmp_path, "uninstall").returncode == 0
    assert settings.read_bytes() == by_hand


def test_a_prompt_entry_with_the_session_start_argument_fails(tmp_path, server):
    """The hook takes a run with `session-start` for a session start whatever the agent
    says; without it, it tells one by the agent's hook_event_name (no finding)."""
    settings = registered_by_hand(tmp_path, server.url, server.admin_key)
    hook = str(BIN / "relay-hook")
    settings["hooks"]["SessionStart"][0]["hooks"][0]["command"] = hook
    entry = {"type": "command", "command": f"{hook} session-start"}
    settings["hooks"]["UserPromptSubmit"].append({"hooks": [entry]})
    (tmp_path / ".claude/settings.json").write_text(json.dumps(settings))
    done = doctor(tmp_path)
    assert done.returncode == 1, done.stdout
    assert failures(tmp_path) == [
        f"hooks: Claude Code: the UserPromptSubmit entry in ~/.claude/settings.json runs {hook} "
        "with the `session-start` argument: the hook takes every prompt for a session start, "
        "so no prompt searches"
    ]
    assert "registers Relay's UserPromptSubmit hook 2 times" in done.stdout


def edit_relay_entry(path, event: str, group: dict | None = None, **handler) -> None:
    """Change the one Relay entry for `event` in an agent's hooks file, as a user would."""
    doc = json.loads(path.read_text())
    (entry,) = doc["hooks"][event]
    entry.update(group or {})
    entry["hooks"][0].update(handler)
    path.write_text(json.dumps(doc))


def test_hook_entries_the_agents_would_not_run_fail(tmp_path, server):
    """QA: doctor said ok for entries edited by hand so they no longer work: a timeout of
    0.1 (seconds: Claude Code kills the hook before its 400 ms deadline), a SessionStart
    matcher of "compact" (the profile then comes only after compaction), and a "prompt"
    type (the command never runs)."""
    installed(tmp_path, server.url, server.admin_key)
    settings = tmp_path / ".claude/settings.json"
    edit_relay_entry(settings, "UserPromptSubmit", timeout=0.1)
    edit_relay_entry(settings, "SessionStart", {"matcher": "compact"}, type="prompt")
    edit_relay_entry(tmp_path / ".codex/hooks.json", "UserPromptSubmit", timeout=2.5)
    done = doctor(tmp_path)
    assert done.returncode == 1, done.stdout
    assert "Recall is wired up" not in done.stdout
    where = "Claude Code: the Relay {} entry in ~/.claude/settings.json"
    failed = failures(tmp_path)
    assert (
        f"hooks: {where.format('UserPromptSubmit')}: its timeout is 0.1 s (seconds), shorter "
        "than the hook may take (its 400 ms deadline and 100 ms to exit): Claude Code kills it "
        "mid-search and shows an error"
    ) in failed, failed
    assert (
        f'hooks: {where.format("SessionStart")} has "type": "prompt", not "command": '
        "Claude Code never runs its command"
    ) in failed
    assert any(
        f.startswith(
            "hooks: Codex: the Relay UserPromptSubmit entry in ~/.codex/hooks.json: its "
            "timeout 2.5 is not whole seconds: Codex cannot read the file"
        )
        for f in failed
    ), failed
    warned = [f["message"] for f in findings(tmp_path) if f["level"] == "warn"]
    assert (
        f'{where.format("SessionStart")} has the matcher "compact": it runs only for sessions '
        "whose source is compact, not startup or resume or clear: those start without the "
        "team profile"
    ) in warned
    assert "fix: remove the timeout or set it to 5 (seconds)" in done.stdout
    assert "Claude Code: UserPromptSubmit" not in done.stdout  # no `ok` for entries never run
    assert "Claude Code: SessionStart" not in done.stdout


def test_hook_entry_fields_that_work_pass(tmp_path, server):
    """A matcher that lets every source through, and a Codex timeout of 0 (Codex runs it
    for at least 1 s), are no finding."""
    installed(tmp_path, server.url, server.admin_key)
    settings = tmp_path / ".claude/settings.json"
    edit_relay_entry(settings, "SessionStart", {"matcher": "startup|resume|clear|compact"})
    edit_relay_entry(settings, "UserPromptSubmit", {"matcher": "nothing"}, timeout=1)
    edit_relay_entry(tmp_path / ".codex/hooks.json", "SessionStart", {"matcher": ".*"}, timeout=0)
    done = doctor(tmp_path)
    assert done.returncode == 0, done.stdout
    assert not [f for f in findings(tmp_path) if f["area"] == "hooks" and f["level"] != "ok"]


def test_a_knob_script_sh_cannot_parse_fails(tmp_path, server):
    """QA: with a quote or a parenthesis too many in the knob script, sh stopped with exit
    status 2 on every prompt and doctor said "Recall is wired up". The knobs are data now,
    so such a typo no longer stops sh; a line sh cannot parse elsewhere stops the script
    before relay-hook, behind its guard: nothing blocks the prompt, and recall is off."""
    installed(tmp_path, server.url, server.admin_key)
    script = tmp_path / ".relay/relay-autosearch-hook.sh"
    text = script.read_text().replace("DEADLINE_MS=400", 'DEADLINE_MS="400')
    exec_line = next(line for line in text.splitlines() if line.startswith("exec /"))
    script.write_text(text.replace(exec_line, f"if then\n{exec_line}"))
    done = doctor(tmp_path)
    assert done.returncode == 1, done.stdout
    assert "Recall is wired up" not in done.stdout
    number = script.read_text().splitlines().index("if then") + 1
    (failed,) = [f for f in failures(tmp_path) if "sh cannot parse" in f]
    assert failed == (
        f"hooks: sh cannot parse ~/.relay/relay-autosearch-hook.sh (line {number}: Syntax "
        'error: "then" unexpected): the script stops there, before relay-hook: recall is '
        "silently off on every prompt (exit status 0, nothing shown)"
    )
    assert "fix: fix the line, or run `relay install` to rewrite" in done.stdout
    assert " -> ~/.relay/relay-autosearch-hook.sh -> " not in done.stdout  # no `ok` for it
    script.write_text(text)
    assert doctor(tmp_path).returncode == 0  # the quote: data, read as DEADLINE_MS=400


def test_a_script_from_before_the_guard_is_read_and_its_upgrade_advised(tmp_path, server):
    """A knob script written before the guard sets its knobs as shell: doctor reads them
    as it always did, says what the missing guard costs, and that `relay install` mends
    it; a typo there still stops sh with exit status 2, which blocks the prompt."""
    installed(tmp_path, server.url, server.admin_key)
    script = tmp_path / ".relay/relay-autosearch-hook.sh"
    text = old_script(str(BIN / "relay-hook")).replace("DEADLINE_MS=400", "DEADLINE_MS=900")
    script.write_text(text)
    config = tmp_path / ".relay/config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "deadline_ms": 500}))
    number = text.splitlines().index("DEADLINE_MS=900") + 1
    done = doctor(tmp_path)
    assert done.returncode == 0, done.stdout
    warned = [f["message"] for f in findings(tmp_path) if f["level"] == "warn"]
    assert warned == [
        "~/.relay/config.json sets deadline_ms to 500, but ~/.relay/relay-autosearch-hook.sh "
        f"sets DEADLINE_MS=900 (line {number}), which the hook takes instead: the config value "
        "is never used",
        "~/.relay/relay-autosearch-hook.sh is as an older `relay install` wrote it, with its "
        "knobs set as shell and no guard line: a typo in a knob, or a relay-hook that moves, "
        "makes it fail with an error the agent shows, and Claude Code blocks a prompt whose "
        "hook exits with 2",
    ], warned
    assert "fix: run `relay install`: it rewrites the script with the guard" in done.stdout

    script.write_text(text.replace("DEADLINE_MS=900", 'DEADLINE_MS="900'))
    (failed,) = failures(tmp_path)
    assert failed.startswith("hooks: sh cannot parse ~/.relay/relay-autosearch-hook.sh (line ")
    assert failed.endswith(
        f'; look at line {number}, `DEADLINE_MS="900`): sh exits with status 2 before it '
        "starts relay-hook, so no prompt gets recall, and Claude Code blocks a prompt whose "
        "hook exits with 2"
    ), failed

    installed(tmp_path, server.url, server.admin_key)
    assert not [f for f in findings(tmp_path) if f["area"] == "hooks" and f["level"] != "ok"]


def test_knob_lines_are_read_as_the_script_reads_them(tmp_path, server):
    """QA: `OVERLAP_THRESHOLD = 0.5` was a command to sh, which left the knob unset. Read
    as data, it is the knob set to 0.5, as meant, and so is a quoted value."""
    installed(tmp_path, server.url, server.admin_key)
    script = tmp_path / ".relay/relay-autosearch-hook.sh"
    text = script.read_text().replace("OVERLAP_THRESHOLD=0.30", "OVERLAP_THRESHOLD = 0.5")
    script.write_text(text.replace("DEADLINE_MS=400", "DEADLINE_MS='900'"))
    config = tmp_path / ".relay/config.json"
    raw = json.loads(config.read_text())
    config.write_text(json.dumps({**raw, "overlap_threshold": 0.5, "deadline_ms": 400}))
    done = doctor(tmp_path)
    assert done.returncode == 0, done.stdout
    warned = [f["message"] for f in findings(tmp_path) if f["level"] == "warn"]
    assert [m for m in warned if "config.json sets" in m] == [
        "~/.relay/config.json sets deadline_ms to 400, but ~/.relay/relay-autosearch-hook.sh "
        f"sets DEADLINE_MS=900 (line {text.splitlines().index('DEADLINE_MS=400') + 1}), which "
        "the hook takes instead: the config value is never used"
    ], warned  # overlap_threshold: the same 0.5 in both


def test_config_knobs_the_hook_script_overrides_are_named(tmp_path, server):
    """QA: a knob set in config.json that the installed script also sets (it exports
    RELAY_<NAME>, which beats the file) never took effect, and doctor said nothing. Read
    from what the script hands the hook, whatever install wrote into config.json."""
    installed(tmp_path, server.url, server.admin_key)
    assert not [f for f in findings(tmp_path) if f["area"] == "config" and f["level"] != "ok"]
    config = tmp_path / ".relay/config.json"
    raw = {"url": server.url, "api_key_file": str(tmp_path / ".relay/key")}  # no knobs at all
    knobs = {"deadline_ms": 900, "min_prompt_len": 15, "max_records": 5, "min_score": 0.3}
    config.write_text(json.dumps({**raw, **knobs}))
    text = (tmp_path / ".relay/relay-autosearch-hook.sh").read_text()
    deadline_line = text.splitlines().index("DEADLINE_MS=400") + 1
    done = doctor(tmp_path)
    assert done.returncode == 0, done.stdout
    warned = [f["message"] for f in findings(tmp_path) if f["area"] == "config"]
    assert warned == [  # min_prompt_len: the script's value too; the others: not the script's
        "~/.relay/config.json sets deadline_ms to 900, but ~/.relay/relay-autosearch-hook.sh "
        f"sets DEADLINE_MS=400 (line {deadline_line}), which the hook takes instead: the config "
        "value is never used",
        f"~/.relay/config.json: server {server.url}, key from ~/.relay/key",
    ], warned
    assert "fix: change DEADLINE_MS in ~/.relay/relay-autosearch-hook.sh, or remove" in done.stdout


def test_an_mcp_registration_with_wrong_args_is_named_and_install_repairs_it(tmp_path, server):
    """QA: `args` edited to ["mcpp"] in ~/.claude.json, or to [] in config.toml, and doctor
    printed `ok mcp ... -> .../relay mcp`: it checked only that the command is executable,
    and wrote `mcp` after it whatever the arguments were."""
    installed(tmp_path, server.url, server.admin_key)
    relay_bin = str(BIN / "relay")
    claude_json = tmp_path / ".claude.json"
    doc = json.loads(claude_json.read_text())
    doc["mcpServers"]["relay"]["args"] = ["mcpp"]
    claude_json.write_text(json.dumps(doc))
    config = tmp_path / ".codex/config.toml"
    config.write_text(config.read_text().replace('args = ["mcp"]', "args = []"))
    done = doctor(tmp_path)
    assert f"-> {relay_bin} mcp" not in done.stdout, done.stdout
    warned = [f["message"] for f in findings(tmp_path) if f["area"] == "mcp"]
    assert warned == [
        f"Claude Code: the `relay` MCP server in ~/.claude.json runs `{relay_bin} mcpp`, not "
        "`relay mcp`: Claude Code gets no Relay MCP server from it (no team_memory_search)",
        f"Codex: the `relay` MCP server in ~/.codex/config.toml runs `{relay_bin}`, not "
        "`relay mcp`: Codex gets no Relay MCP server from it (no team_memory_search)",
    ], warned
    assert done.stdout.count("fix: run `relay install` again: it rewrites this entry") == 2
    installed(tmp_path, server.url, server.admin_key)
    repaired = [f for f in findings(tmp_path) if f["area"] == "mcp"]
    assert [(f["level"], f["message"]) for f in repaired] == [
        ("ok", f"Claude Code: MCP server `relay` -> {relay_bin} mcp"),
        ("ok", f"Codex: MCP server `relay` -> {relay_bin} mcp"),
    ]


def test_an_mcp_server_install_did_not_write_gets_a_fix_by_hand(tmp_path, server):
    done = relay(tmp_path, "install", "--url", server.url, "--key", server.admin_key, "--no-mcp")
    assert done.returncode == 0, done.stderr
    config = tmp_path / ".codex/config.toml"
    config.write_text(config.read_text() + '\n[mcp_servers.relay]\ncommand = "/bin/true"\n')
    (tmp_path / ".claude.json").write_text(
        json.dumps({"mcpServers": {"relay": {"type": "http", "url": f"{server.url}/mcp"}}})
    )
    mcp = [f for f in findings(tmp_path) if f["area"] == "mcp"]
    assert [(f["level"], f["message"]) for f in mcp] == [
        ("ok", f"Claude Code: MCP server `relay` -> {server.url}/mcp (over HTTP; not called here)"),
        (
            "warn",
            "Codex: the `relay` MCP server in ~/.codex/config.toml runs `/bin/true`, not "
            "`relay mcp`: Codex gets no Relay MCP server from it (no team_memory_search)",
        ),
    ]
    assert mcp[1]["fix"].startswith("`relay install` leaves a [mcp_servers.relay] it did not")


def test_codex_mcp_server_gets_the_relay_config_install_wrote(tmp_path, server):
    """QA: installed with RELAY_CONFIG set, Codex's `relay mcp` never saw it (Codex hands an
    MCP server only a few variables and those its entry names): it read ~/.relay/config.json,
    absent, and every tool call failed with "no server URL" while doctor said ok."""
    where = {"RELAY_CONFIG": str(tmp_path / "relay-elsewhere.json")}
    done = relay(tmp_path, "install", "--url", server.url, "--key", server.admin_key, **where)
    assert done.returncode == 0, done.stderr
    relay_bin = str(BIN / "relay")
    codex = [f for f in findings(tmp_path, **where) if f["message"].startswith("Codex: MCP")]
    assert [(f["level"], f["message"]) for f in codex] == [
        ("ok", f"Codex: MCP server `relay` -> {relay_bin} mcp")
    ]
    # What an earlier install wrote: the entry without env_vars.
    config = tmp_path / ".codex/config.toml"
    config.write_text(re.sub(r"^env_vars = .*\n", "", config.read_text(), flags=re.M))
    mcp = [f for f in findings(tmp_path, **where) if f["area"] == "mcp" and "Codex" in f["message"]]
    assert [(f["level"], f["fix"]) for f in mcp] == [
        ("warn", "run `relay install` again: it rewrites this entry")
    ]
    assert "without RELAY_CONFIG" in mcp[0]["message"]
    assert "~/relay-elsewhere.json, and every call fails" in mcp[0]["message"]
    # A shell without RELAY_CONFIG is not told of it: that Codex reads ~/.relay/config.json,
    # and neither is one whose RELAY_CONFIG names that very file (QA: doctor said it read
    # "~/.relay/config.json, not ~/.relay/config.json, and every call fails").
    for usual in ({}, {"RELAY_CONFIG": str(tmp_path / ".relay/config.json")}):
        codex = [f for f in findings(tmp_path, **usual) if f["message"].startswith("Codex: ")]
        assert all(f["level"] == "ok" for f in codex if "MCP" in f["message"]), codex


def test_doctor_checks_the_files_install_wrote_wherever_they_are(tmp_path, server):
    """QA: installed with CLAUDE_CONFIG_DIR and CODEX_HOME set, doctor run without them
    printed no MCP finding at all and read the Codex hooks flag from ~/.codex/config.toml;
    install recorded where it wrote (install.json), and doctor now reads those files."""
    claude_dir, codex_home = tmp_path / "claude-config", tmp_path / "codex-home"
    done = relay(
        tmp_path,
        "install",
        "--url",
        server.url,
        "--key",
        server.admin_key,
        CLAUDE_CONFIG_DIR=str(claude_dir),
        CODEX_HOME=str(codex_home),
    )
    assert done.returncode == 0, done.stderr
    config = codex_home / "config.toml"
    config.write_text(config.read_text().replace("hooks = true", "hooks = false"))
    (tmp_path / ".codex").mkdir()
    (tmp_path / ".codex/config.toml").write_text("[features]\nhooks = true\n")
    done = doctor(tmp_path)
    assert done.returncode == 1, done.stdout
    relay_bin = BIN / "relay"
    mcp = [(f["level"], f["message"]) for f in findings(tmp_path) if f["area"] == "mcp"]
    assert mcp == [
        ("ok", f"Claude Code: MCP server `relay` -> {relay_bin} mcp"),
        ("ok", f"Codex: MCP server `relay` -> {relay_bin} mcp"),
    ], mcp
    assert failures(tmp_path) == [
        "hooks: Codex: hooks are turned off in ~/codex-home/config.toml ([features] hooks = false)"
    ]
    assert "Claude Code: UserPromptSubmit and SessionStart in ~/claude-config/settings.json" in (
        done.stdout
    )


def test_agent_folders_install_wrote_that_this_shell_does_not_set_are_named(tmp_path, server):
    """QA: installed with CLAUDE_CONFIG_DIR and CODEX_HOME set, doctor run in a shell
    without them said "Recall is wired up", though agents started from it read ~/.claude
    and ~/.codex, which have no Relay hooks."""
    shell = {"CLAUDE_CONFIG_DIR": str(tmp_path / "cc"), "CODEX_HOME": str(tmp_path / "cx")}
    (tmp_path / "cx").mkdir()
    done = relay(tmp_path, "install", "--url", server.url, "--key", server.admin_key, **shell)
    assert done.returncode == 0, done.stderr
    done = doctor(tmp_path)
    assert done.returncode == 0, done.stdout
    assert "Recall is wired up. 2 warning(s)." in done.stdout
    warned = [(f["area"], f["message"], f["fix"]) for f in findings(tmp_path) if f["level"] != "ok"]
    assert warned == [
        (
            "hooks",
            "`relay install` wrote Claude Code's files in ~/cc (CLAUDE_CONFIG_DIR set then), but "
            "CLAUDE_CONFIG_DIR is not set in this shell: Claude Code started without it reads "
            "~/.claude/settings.json and ~/.claude.json, which lack Relay's hooks and the "
            "`relay` MCP server: no automatic recall in those sessions",
            "set CLAUDE_CONFIG_DIR=~/cc where you start Claude Code, or run `relay install` "
            "without CLAUDE_CONFIG_DIR (it writes ~/.claude/settings.json)",
        ),
        (
            "hooks",
            "`relay install` wrote Codex's files in ~/cx (CODEX_HOME set then), but CODEX_HOME "
            "is not set in this shell: Codex started without it reads ~/.codex/hooks.json and "
            "~/.codex/config.toml, which lack Relay's hooks and the `relay` MCP server: no "
            "automatic recall in those sessions",
            "set CODEX_HOME=~/cx where you start Codex, or run `relay install` without "
            "CODEX_HOME (it writes ~/.codex/hooks.json)",
        ),
    ]
    # Either fix it gives clears it: the variables set where the agents start,
    done = doctor(tmp_path, **shell)
    assert done.returncode == 0 and "0 warning(s)" in done.stdout, done.stdout
    # or install without them, after which the usual files have Relay's hooks too.
    assert relay(tmp_path, "install").returncode == 0
    done = doctor(tmp_path)
    assert done.returncode == 0 and "0 warning(s)" in done.stdout, done.stdout
    assert "Claude Code: UserPromptSubmit and SessionStart in ~/.claude/settings.json" in (
        done.stdout
    )


def test_agent_folders_set_in_this_shell_that_install_did_not_write_are_named(tmp_path, server):
    """QA: installed without them, then doctor run with CLAUDE_CONFIG_DIR (an empty folder)
    and CODEX_HOME set: every check ok, "Recall is wired up", though agents started from
    that shell read their hooks and MCP servers there, and get neither."""
    installed(tmp_path, server.url, server.admin_key)
    (tmp_path / "cc").mkdir()
    shell = {"CLAUDE_CONFIG_DIR": str(tmp_path / "cc"), "CODEX_HOME": str(tmp_path / "cx")}
    done = doctor(tmp_path, **shell)
    assert done.returncode == 0, done.stdout
    assert "2 warning(s)" in done.stdout
    warned = [(f["area"], f["message"], f["fix"]) for f in findings(tmp_path, **shell)]
    warned = [w for w in warned if "is set in this shell" in w[1]]
    assert warned == [
        (
            "hooks",
            "CLAUDE_CONFIG_DIR is set in this shell and overrides ~/.claude and ~/.claude.json "
            "for Claude Code started from it: it reads ~/cc/settings.json and ~/cc/.claude.json,"
            " which lack Relay's hooks and the `relay` MCP server: no automatic recall in those "
            "sessions",
            "run `relay install` with CLAUDE_CONFIG_DIR set (it writes there), or unset "
            "CLAUDE_CONFIG_DIR unless you mean it",
        ),
        (
            "hooks",
            "CODEX_HOME is set in this shell and overrides ~/.codex for Codex started from it: "
            "it reads ~/cx/hooks.json and ~/cx/config.toml, which lack Relay's hooks and the "
            "`relay` MCP server: no automatic recall in those sessions; ~/cx does not exist, "
            "and Codex refuses to start until it does",
            "run `relay install` with CODEX_HOME set (it writes there), or unset CODEX_HOME "
            "unless you mean it",
        ),
    ]
    # The folder Claude Code reads by default, named: its MCP servers move into it.
    (only_mcp,) = [
        f
        for f in findings(tmp_path, CLAUDE_CONFIG_DIR=str(tmp_path / ".claude"))
        if f["level"] == "warn"
    ]
    assert (only_mcp["area"], only_mcp["message"]) == (
        "mcp",
        "CLAUDE_CONFIG_DIR is set in this shell and overrides ~/.claude and ~/.claude.json for "
        "Claude Code started from it: it reads ~/.claude/settings.json and "
        "~/.claude/.claude.json, which lack the `relay` MCP server: no team_memory_search in "
        "those sessions",
    )
    # The fix it gives: install with them set writes where those agents read, and clears it
    done = relay(tmp_path, "install", **shell)
    assert done.returncode == 0, done.stderr
    done = doctor(tmp_path, **shell)
    assert done.returncode == 0 and "0 warning(s)" in done.stdout, done.stdout
    assert "Claude Code: UserPromptSubmit and SessionStart in ~/cc/settings.json" in done.stdout
    assert "Codex: UserPromptSubmit and SessionStart in ~/cx/hooks.json" in done.stdout
    # and uninstall, run without them, finds what it wrote there
    assert relay(tmp_path, "uninstall").returncode == 0
    for path in ("cc/settings.json", "cc/.claude.json", "cx/hooks.json", "cx/config.toml"):
        assert not (tmp_path / path).exists(), path


def test_the_breaker_says_what_it_does_open_and_half_open(tmp_path, server):
    """QA: with the breaker half-open doctor said searches were skipped for a cool-down,
    though half-open means the next prompt's search probes the server."""
    installed(tmp_path, server.url, server.admin_key)
    config = tmp_path / ".relay/config.json"
    elsewhere = f"http://127.0.0.1:{free_port()}"  # nothing listens: unavailable at once
    settings = {**json.loads(config.read_text()), "url": elsewhere, "breaker_cooldown_s": 3600}
    config.write_text(json.dumps(settings))
    for n in range(3):
        prompt(tmp_path, session=f"breaker-{n}")
    (log,) = [f["message"] for f in findings(tmp_path) if "circuit breaker" in f["message"]]
    assert log.startswith(f"the hook's circuit breaker for {elsewhere} is open (after 3 failures")
    assert log.endswith(
        "prompts skip their search for 3600 s from then, then one probes the server"
    )
    config.write_text(json.dumps({**settings, "breaker_cooldown_s": 0}))
    (log,) = [f["message"] for f in findings(tmp_path) if "circuit breaker" in f["message"]]
    assert log == (
        f"the hook's circuit breaker for {elsewhere} is half-open (after 3 failures): its "
        "cool-down is over, and the next prompt's search probes the server; an answer closes "
        "it, a failure opens it again"
    )


@pytest.mark.parametrize(
    ("edit", "cause"),
    [
        (
            lambda text: text.replace("#!/bin/sh\n", "#!/bin/shh\n", 1),
            "its first line, `#!/bin/shh`, names /bin/shh, which does not exist or is not "
            "executable",
        ),
        (
            lambda text: text.replace("\n", "\r\n"),
            "its first line, `#!/bin/sh`, ends in a carriage return (\\r): the file has Windows "
            "(CRLF) line endings, so the kernel looks for a program named '/bin/sh\\r', which "
            "does not exist",
        ),
    ],
    ids=["misspelt", "crlf"],
)
def test_a_knob_script_the_kernel_cannot_start_fails(tmp_path, server, edit, cause):
    """QA: with `#!/bin/shh`, or the script saved with CRLF endings (`#!/bin/sh\\r`), the
    registered command exits 127 with an error the agent shows on every prompt; doctor said
    "Recall is wired up", or (CRLF) that the script stops behind its guard with status 0."""
    installed(tmp_path, server.url, server.admin_key)
    script = tmp_path / ".relay/relay-autosearch-hook.sh"
    script.write_bytes(edit(script.read_text()).encode())
    command = registered_command(tmp_path / ".claude/settings.json", "UserPromptSubmit")
    run = run_registered(command, tmp_path, {"session_id": "s", "prompt": "how do we deploy?"})
    assert run.returncode == 127 and run.stderr, run
    done = doctor(tmp_path)
    assert done.returncode == 1, done.stdout
    assert "Recall is wired up" not in done.stdout
    (failed,) = failures(tmp_path)  # once, though both agents run the script
    assert failed == (
        f"hooks: ~/.relay/relay-autosearch-hook.sh cannot be started: {cause}; the agent's sh "
        "fails with exit status 127 and shows the error on every prompt, with no recall"
    )
    assert "fix: run `relay install` to rewrite ~/.relay/relay-autosearch-hook.sh" in done.stdout
    installed(tmp_path, server.url, server.admin_key)
    assert doctor(tmp_path).returncode == 0


def test_a_deadline_past_the_entries_timeout_gets_a_fix_that_works(tmp_path, server):
    """QA: with DEADLINE_MS=4950 (the script takes up to 10000) the entries' timeout of 5 s
    is too short, and the fix said to set it to 5 (seconds), which it already was."""
    installed(tmp_path, server.url, server.admin_key)
    script = tmp_path / ".relay/relay-autosearch-hook.sh"
    script.write_text(script.read_text().replace("DEADLINE_MS=400", "DEADLINE_MS=4950"))
    fixes = {f["fix"] for f in findings(tmp_path) if f["level"] == "fail"}
    assert fixes == {
        "raise the timeout to at least 6 (seconds), or remove it, or lower the hook's deadline "
        "to at most 4900 ms (DEADLINE_MS in ~/.relay/relay-autosearch-hook.sh)"
    }, fixes


def test_a_deadline_from_the_environment_is_named_as_its_source(tmp_path, server):
    """QA: with RELAY_DEADLINE_MS=6000 doctor's fix said to lower DEADLINE_MS in the
    script, which the variable beats: the fix names the variable."""
    installed(tmp_path, server.url, server.admin_key)
    done = relay(tmp_path, "doctor", "--json", RELAY_DEADLINE_MS="6000")
    fixes = {f["fix"] for f in json.loads(done.stdout) if f["level"] == "fail"}
    assert fixes == {
        "remove the timeout or set it to 8 (seconds), or run `relay install` to rewrite the "
        "entry, or lower the hook's deadline to at most 4900 ms (RELAY_DEADLINE_MS, set in this "
        "shell, which beats the script's DEADLINE_MS)"
    }, fixes


def test_install_registers_the_timeout_the_deadline_needs_and_doctor_agrees(tmp_path, server):
    """RELAY_DEADLINE_MS takes up to 10,000 ms, but install registered a 5 s timeout
    whatever it was: the agents killed the hook mid-search, and doctor, right after
    install, failed the entries install had just written. Install now registers the
    deadline, 100 ms to exit and a second, in whole seconds (Codex takes no fraction)."""
    done = relay(
        tmp_path,
        "install",
        "--url",
        server.url,
        "--key",
        server.admin_key,
        RELAY_DEADLINE_MS="10000",
    )
    assert done.returncode == 0, done.stderr
    assert "timeout 12 s, not 5: the hook's deadline is 10000 ms" in done.stdout
    for settings in (tmp_path / ".claude/settings.json", tmp_path / ".codex/hooks.json"):
        timeouts = {
            event: [h["timeout"] for group in groups for h in group["hooks"]]
            for event, groups in json.loads(settings.read_text())["hooks"].items()
        }
        assert timeouts == {"UserPromptSubmit": [12], "SessionStart": [12]}, settings
    checked = json.loads(relay(tmp_path, "doctor", "--json", RELAY_DEADLINE_MS="10000").stdout)
    assert not [f for f in checked if f["level"] == "fail" and "timeout" in f["message"]]
    # Without the variable the hook runs with the script's 400 ms: install registers 5 s.
    installed(tmp_path, server.url, server.admin_key)
    settings = json.loads((tmp_path / ".claude/settings.json").read_text())
    assert settings["hooks"]["UserPromptSubmit"][0]["hooks"][0]["timeout"] == 5


def test_misspelt_keys_in_the_config_file_are_named(tmp_path, server):
    """QA: max_record, profil and api_key_fil in ~/.relay/config.json, which the hook skips
    unread, and doctor said nothing; `relay eval replay --config` names them, as this does."""
    installed(tmp_path, server.url, server.admin_key)
    config = tmp_path / ".relay/config.json"
    typos = {"max_record": 5, "profil": False, "api_key_fil": "~/.relay/key"}
    config.write_text(json.dumps({**json.loads(config.read_text()), **typos}))
    warned = [f for f in findings(tmp_path) if f["level"] == "warn"]
    assert [(f["message"], f["fix"]) for f in warned] == [
        (
            f"the hook ignores {typo} in ~/.relay/config.json (not a setting; did you mean "
            f"{meant}?)",
            f"correct or remove {typo} in ~/.relay/config.json",
        )
        for typo, meant in [
            ("max_record", "max_records"),
            ("profil", "profile"),
            ("api_key_fil", "api_key_file"),
        ]
    ], warned  # and not the _comment install writes


def test_a_key_file_with_a_byte_order_mark_is_named_for_it(tmp_path, server):
    """QA: a key file saved with a UTF-8 byte-order mark (printf '\\xef\\xbb\\xbf%s\\n' "$KEY")
    was "missing, unreadable or empty". The hook takes no key from it (it sends printable
    ASCII only), so doctor fails, and says why."""
    installed(tmp_path, server.url, server.admin_key)
    key_file = tmp_path / ".relay/key"
    key_file.write_bytes(b"\xef\xbb\xbf" + server.admin_key.encode() + b"\n")
    prompt(tmp_path)
    log = json.loads((tmp_path / ".relay/state/outcomes.jsonl").read_text().splitlines()[-1])
    assert (log["outcome"], log["reason"]) == ("disabled", "bad_key"), log  # no key sent
    named = "the key file ~/.relay/key (named by api_key_file in ~/.relay/config.json)"
    (failed,) = [f for f in findings(tmp_path) if f["level"] == "fail"]
    assert failed["message"] == (
        f"{named} starts with a byte-order mark (the bytes EF BB BF, which some editors put at"
        " the start of a UTF-8 file): the hook sends no key, and no prompt gets recall"
    )
    assert failed["fix"].startswith("save ~/.relay/key without the mark (as plain ASCII), or ")
    key_file.write_bytes(b"")
    (failed,) = [f for f in findings(tmp_path) if f["level"] == "fail"]
    assert (failed["message"], failed["fix"]) == (
        f"{named} is empty: the hook sends no key, and no prompt gets recall",
        "write the API key on the first line of ~/.relay/key, or run `relay install --key-file"
        " FILE`, which writes the key file afresh",
    )


def test_a_key_the_hook_cannot_send_is_named_where_the_hook_found_it(tmp_path, server):
    """doctor words the hook's own reading of its key (relay.key_source): a key file gone,
    named by RELAY_API_KEY_FILE, and a key in RELAY_API_KEY with a space, which the hook
    takes before config.json's key file."""
    installed(tmp_path, server.url, server.admin_key)
    gone = tmp_path / "gone.key"
    env = {"RELAY_API_KEY_FILE": str(gone)}
    (failed,) = [f for f in findings(tmp_path, **env) if f["level"] == "fail"]
    assert (failed["message"], failed["fix"]) == (
        "the key file ~/gone.key (named by RELAY_API_KEY_FILE) does not exist: the hook sends"
        " no key, and no prompt gets recall",
        "write the API key on the first line of ~/gone.key, or set RELAY_API_KEY_FILE to the"
        " right file, or unset it",
    )
    spaced = server.admin_key[:8] + " " + server.admin_key[8:]
    (failed,) = [f for f in findings(tmp_path, RELAY_API_KEY=spaced) if f["level"] == "fail"]
    assert (failed["message"], failed["fix"]) == (
        "the API key in RELAY_API_KEY holds a space (character 9), which no key has: the hook"
        " sends no key, and no prompt gets recall",
        "fix RELAY_API_KEY",
    )


def test_without_a_key_the_server_is_still_checked_and_then_the_key_is_said_missing(
    tmp_path, server
):
    """QA: with ~/.relay/key gone, doctor printed no `server` line at all, though /healthz
    takes no key: whether the server was up went unsaid. It is checked now, and the missing
    key is the key's finding, after it (with the server down too)."""
    installed(tmp_path, server.url, server.admin_key)
    (tmp_path / ".relay/key").unlink()
    chain = [f for f in findings(tmp_path) if f["area"] in ("config", "server", "key")]
    assert [(f["area"], f["level"]) for f in chain] == [
        ("config", "ok"),
        ("server", "ok"),
        ("key", "fail"),
    ], chain
    assert chain[0]["message"] == (
        f"~/.relay/config.json: server {server.url}, no key the hook can send (see key)"
    )
    assert chain[1]["message"].startswith(f"{server.url} answers /healthz in ")
    assert chain[2]["message"] == (
        "the key file ~/.relay/key (named by api_key_file in ~/.relay/config.json) does not"
        " exist: the hook sends no key, and no prompt gets recall"
    )
    away = f"http://127.0.0.1:{free_port()}"
    failed = [f["area"] for f in findings(tmp_path, RELAY_URL=away) if f["level"] == "fail"]
    assert failed == ["server", "key"]


class _NotRelay(BaseHTTPRequestHandler):
    """Some other web server: 404, as HTML, for every path."""

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        body = b"<html><body>Not Found</body></html>"
        self.send_response(404)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def not_relay():
    web = ThreadingHTTPServer(("127.0.0.1", 0), _NotRelay)
    thread = threading.Thread(target=web.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{web.server_address[1]}"
    web.shutdown()
    web.server_close()
    thread.join()


def test_a_url_from_relay_url_is_named_as_such_and_so_is_a_server_not_relay(
    tmp_path, server, not_relay
):
    """QA: with RELAY_URL set to another URL, doctor said `ok config ~/.relay/config.json:
    server URL`, a URL that is not in that file; and a 404 from a web server that is not
    Relay got the fix "fix `url` in ~/.relay/config.json", where the URL did not come from."""
    installed(tmp_path, server.url, server.admin_key)
    # with a key of its own: the installed one is not sent to another server
    own = {"RELAY_URL": not_relay, "RELAY_API_KEY_FILE": str(tmp_path / ".relay/key")}
    done = doctor(tmp_path, **own)
    assert done.returncode == 1, done.stdout
    found = json.loads(relay(tmp_path, "doctor", "--json", **own).stdout)
    (ok,) = [f["message"] for f in found if f["area"] == "config" and f["level"] == "ok"]
    assert ok == (
        f"~/.relay/config.json: server {not_relay} from RELAY_URL (not this file's url, "
        f"{server.url}), key from ~/.relay/key"
    )
    (failed,) = [f for f in found if f["level"] == "fail"]
    assert failed["message"] == (
        f"{not_relay} is not a Relay server root: GET {not_relay}/v1/whoami got 404 Not Found;"
        " give the root URL `relay serve` prints (the one /healthz and /v1/... are under): every "
        "prompt goes without team memory"
    )
    assert failed["fix"] == (
        "fix RELAY_URL (set in this shell; unset, the config file's url applies)"
    )
    config = tmp_path / ".relay/config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "url": not_relay}))
    (failed,) = failures(tmp_path)
    assert failed.startswith(f"server: {not_relay} is not a Relay server root"), failed
    assert "fix: fix `url` in ~/.relay/config.json (`relay install --url ROOT`)" in (
        doctor(tmp_path).stdout
    )


def test_a_server_answering_json_200_to_everything_is_not_a_relay_root(tmp_path, server):
    """QA: a web server answering {"status":"ok","data":[]} to every request passed as ok,
    then doctor said "FAIL key: key None lacks memory:read"."""
    from hook_support import FakeRelay, reply

    installed(tmp_path, server.url, server.admin_key)
    with FakeRelay(reply(200, {"status": "ok", "data": []})) as other:
        own = {"RELAY_URL": other.url, "RELAY_API_KEY_FILE": str(tmp_path / ".relay/key")}
        found = json.loads(relay(tmp_path, "doctor", "--json", **own).stdout)
    assert [f for f in found if f["area"] in ("server", "key") and f["level"] == "ok"] == []
    (failed,) = [f for f in found if f["level"] == "fail"]
    assert (failed["area"], failed["message"]) == (
        "server",
        f"{other.url} is not a Relay server root: GET {other.url}/v1/whoami got an answer that"
        " is not Relay's; give the root URL `relay serve` prints (the one /healthz and /v1/..."
        " are under): every prompt goes without team memory",
    )


def test_a_recorded_file_gone_with_its_folder_is_a_note_not_a_failure(tmp_path, server):
    """QA: installed with CLAUDE_CONFIG_DIR set to a folder since deleted, doctor failed
    for ever with "no Relay hooks in .../settings.json", and its fix, `relay install --agent
    claude-code`, writes elsewhere and cannot clear it."""
    import shutil

    claude_dir = tmp_path / "claude-config"
    done = relay(
        tmp_path,
        *("install", "--url", server.url, "--key", server.admin_key),
        CLAUDE_CONFIG_DIR=str(claude_dir),
    )
    assert done.returncode == 0, done.stderr
    shutil.rmtree(claude_dir)
    done = doctor(tmp_path)
    assert done.returncode == 0, done.stdout
    notes = [
        (f["area"], f["message"])
        for f in findings(tmp_path)
        if "its folder is gone" in f["message"]
    ]
    assert notes == [
        (
            area,
            f"note: ~/.relay/install.json records ~/claude-config/{name}, which an earlier "
            "`relay install` wrote, but its folder is gone: nothing there to check (to drop the "
            "record: `relay uninstall --project ~/claude-config`)",
        )
        for area, name in [("hooks", "settings.json"), ("mcp", ".claude.json")]
    ], notes
    # Claude Code now reads ~/.claude: as if never installed there, its hooks are expected
    (tmp_path / ".claude").mkdir()
    assert failures(tmp_path) == [
        "hooks: Claude Code: no Relay hooks in ~/.claude/settings.json: no automatic recall"
    ]
    installed_claude = relay(
        tmp_path,
        *("install", "--url", server.url, "--key", server.admin_key, "--agent", "claude-code"),
    )
    assert installed_claude.returncode == 0, installed_claude.stderr
    assert failures(tmp_path) == []  # the fix it gave clears it
    dropped = relay(tmp_path, "uninstall", "--project", str(claude_dir))  # the note's fix
    assert dropped.returncode == 0, dropped.stderr
    assert not [f for f in findings(tmp_path) if "its folder is gone" in f["message"]]
    assert failures(tmp_path) == []  # the user-level install stays


def set_key(path, **settings) -> None:
    """Set top-level keys of a JSON settings file, as a user would."""
    doc = json.loads(path.read_text()) if path.exists() else {}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**doc, **settings}))


def test_hooks_switched_off_in_a_recorded_project_fail_without_project(tmp_path, server):
    """QA: doctor without --project missed `"disableAllHooks": true` in a project the
    install record names: it read only --project's settings."""
    installed(tmp_path, server.url, server.admin_key)
    project = tmp_path / "repo"
    project.mkdir()
    done = relay(
        tmp_path,
        "install",
        "--url",
        server.url,
        "--key",
        server.admin_key,
        "--project",
        str(project),
    )
    assert done.returncode == 0, done.stderr

    def switched_off() -> list[str]:
        return [m for m in failures(tmp_path) if "disableAllHooks" in m]

    assert switched_off() == []
    for name in ("settings.json", "settings.local.json"):
        set_key(project / ".claude" / name, disableAllHooks=True)
        assert switched_off() == [
            f'hooks: Claude Code: ~/repo/.claude/{name} sets "disableAllHooks": true: Claude'
            " Code runs no hooks, Relay's included: no automatic recall"
        ]
        set_key(project / ".claude" / name, disableAllHooks=False)
    assert switched_off() == []


def test_claude_code_hooks_switched_off_fail(tmp_path, server):
    """QA: `"disableAllHooks": true` in Claude Code's settings, and doctor said recall was
    wired up, though Claude Code then runs no hooks. A project's settings.local.json beats
    its settings.json, which beats the user's (CLAUDE_CONFIG_DIR when set)."""
    installed(tmp_path, server.url, server.admin_key)
    user = tmp_path / ".claude/settings.json"
    set_key(user, disableAllHooks=True)
    done = doctor(tmp_path)
    assert done.returncode == 1, done.stdout
    assert failures(tmp_path) == [
        'hooks: Claude Code: ~/.claude/settings.json sets "disableAllHooks": true: Claude Code '
        "runs no hooks, Relay's included: no automatic recall"
    ]
    assert 'fix: remove "disableAllHooks" from ~/.claude/settings.json, or set it to false' in (
        done.stdout
    )

    project = tmp_path / "repo"
    project.mkdir()
    done = relay(
        tmp_path,
        "install",
        "--url",
        server.url,
        "--key",
        server.admin_key,
        "--project",
        str(project),
    )
    assert done.returncode == 0, done.stderr

    def project_failures() -> list[str]:
        found = json.loads(relay(tmp_path, "doctor", "--json", "--project", str(project)).stdout)
        return [f["message"] for f in found if "disableAllHooks" in f["message"]]

    set_key(project / ".claude/settings.json", disableAllHooks=False)
    assert project_failures() == []  # the project's false beats the user's true
    set_key(project / ".claude/settings.local.json", disableAllHooks=True)
    assert project_failures() == [
        'Claude Code: ~/repo/.claude/settings.local.json sets "disableAllHooks": true: Claude '
        "Code runs no hooks, Relay's included: no automatic recall"
    ]

    elsewhere = tmp_path / "claude-config"
    done = relay(
        tmp_path,
        *("install", "--url", server.url, "--key", server.admin_key),
        CLAUDE_CONFIG_DIR=str(elsewhere),
    )
    assert done.returncode == 0, done.stderr
    set_key(user, disableAllHooks=False)
    set_key(elsewhere / "settings.json", disableAllHooks=True)
    found = json.loads(relay(tmp_path, "doctor", "--json").stdout)
    assert [f["message"] for f in found if "disableAllHooks" in f["message"]] == [
        'Claude Code: ~/claude-config/settings.json sets "disableAllHooks": true: Claude Code '
        "runs no hooks, Relay's included: no automatic recall",
        # the recorded project's own, found without --project too
        'Claude Code: ~/repo/.claude/settings.local.json sets "disableAllHooks": true: Claude '
        "Code runs no hooks, Relay's included: no automatic recall",
    ]


def test_a_record_of_skill_install_alone_is_not_an_install(tmp_path):
    """Skill install records its files in install.json; doctor took any record for one
    that `relay install` wrote, and stopped naming the missing hooks in ~/.claude."""
    assert relay(tmp_path, "skill", "install").returncode == 0
    assert (tmp_path / ".relay/install.json").exists()
    assert (
        "hooks: Claude Code: no Relay hooks in ~/.claude/settings.json: no automatic recall"
    ) in failures(tmp_path)
