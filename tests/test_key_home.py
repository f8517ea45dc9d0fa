"""The installed key goes to the installed server only: a URL from outside the installed
config, `--url` or a RELAY_URL in the shell (a stale export, a teammate's .envrc), gets it
in no `relay` command, nor from the hook, `relay install` or `relay doctor`. Each is run as
a user runs it, in a temp HOME that `relay install` set up against a real server on
loopback; the other server is a socket server that records every request's headers.
"""

from __future__ import annotations

import json

import pytest
from hook_support import FakeRelay
from integration_support import registered_command, relay, run_registered

from relay.hook.config import same_server

PROMPT = {
    "session_id": "key-home",
    "prompt_id": "p1",
    "hook_event_name": "UserPromptSubmit",
    "prompt": "how do we deploy the billing service to staging?",
}


@pytest.fixture
def home(tmp_path, live_server):
    done = relay(tmp_path, "install", "--url", live_server.url, "--key", live_server.admin_key)
    assert done.returncode == 0, done.stderr
    return tmp_path


def refused(url: str, installed: str) -> str:
    return f"{url} is not the server this machine's key is for ({installed})"


def sent_keys(server: FakeRelay) -> list[str | None]:
    return [r.headers.get("authorization") for r in server.requests]


def test_relay_url_naming_another_server_gets_no_installed_key(home, live_server):
    """QA: `relay install`, then RELAY_URL=OTHER (a stale export) sent the installed key to
    OTHER with every command, while `--url OTHER` was refused."""
    with FakeRelay() as other:
        out = str(home / "out.jsonl")
        for args in (
            ("search", "how do we deploy?"),
            ("remember", "a fact"),
            ("export", "-o", out),
        ):
            done = relay(home, *args, RELAY_URL=other.url)
            assert done.returncode == 2 and done.stdout == "", done.stdout
            assert done.stderr == (
                f"relay: error: {refused(f'RELAY_URL ({other.url})', live_server.url)}: pass"
                " --key or --key-file (or set RELAY_API_KEY_FILE or RELAY_API_KEY) for that"
                " server, or unset RELAY_URL\n"
            )
        # --url beats RELAY_URL both ways: the installed server gets its key whatever the
        # shell exports, and another server named by the flag gets none
        done = relay(
            home, "search", "how do we deploy?", "--url", live_server.url, RELAY_URL=other.url
        )
        assert done.returncode == 0, done.stderr
        done = relay(home, "search", "deploy", "--url", other.url, RELAY_URL=live_server.url)
        assert done.returncode == 2 and done.stderr.startswith(
            f"relay: error: {refused(other.url, live_server.url)}: pass --key or --key-file"
        )
        done = relay(home, "stats", "--send", RELAY_URL=other.url)
        assert done.returncode == 2 and done.stderr == (
            f"relay: error: {refused(f'RELAY_URL ({other.url})', live_server.url)}: set"
            " RELAY_API_KEY_FILE (or RELAY_API_KEY) for that server, or unset RELAY_URL\n"
        )
        assert other.connections == 0


def test_a_relay_url_that_is_no_url_is_told_as_such_not_as_another_server(home):
    """Review: RELAY_URL=127.0.0.1:8961 (no scheme) was told 'is not the server this
    machine's key is for ... pass --key', pointing the user at keys instead of the typo."""
    for value in ("127.0.0.1:8961", "not a url"):
        done = relay(home, "search", "how do we deploy?", RELAY_URL=value)
        assert (done.returncode, done.stderr) == (
            2,
            f"relay: error: {value!r} is not a Relay server URL: give http://host:port"
            " (or https://...)\n",
        )


def test_a_key_of_its_own_goes_where_relay_url_says(home, live_server, tmp_path_factory):
    """RELAY_URL with a key this shell names (RELAY_API_KEY_FILE, RELAY_API_KEY, --key) is
    the user's own choice for it: that key goes, and never the installed one."""
    installed = f"Bearer {live_server.admin_key}"
    own = tmp_path_factory.mktemp("own") / "other.key"
    own.write_text("relay_o_" + "f" * 24 + "\n")
    with FakeRelay() as other:
        by_file = {"RELAY_URL": other.url, "RELAY_API_KEY_FILE": str(own)}
        assert relay(home, "search", "deploy", **by_file).returncode == 0
        by_env = {"RELAY_URL": other.url, "RELAY_API_KEY": "relay_e_" + "e" * 24}
        assert relay(home, "search", "deploy", **by_env).returncode == 0
        by_flag = ("--key", "relay_k_" + "k" * 24)
        assert relay(home, "search", "deploy", *by_flag, RELAY_URL=other.url).returncode == 0
        by_file_flag = ("--url", other.url, "--key-file", str(own))
        assert relay(home, "search", "deploy", *by_file_flag).returncode == 0
        assert sent_keys(other) == [
            "Bearer relay_o_" + "f" * 24,
            "Bearer relay_e_" + "e" * 24,
            "Bearer relay_k_" + "k" * 24,
            "Bearer relay_o_" + "f" * 24,
        ]
        assert installed not in sent_keys(other)


def test_every_client_command_reads_its_key_from_a_key_file(tmp_path, live_server):
    """QA: the README said another server needs its own `--key`, `--key-file` or
    RELAY_API_KEY_FILE, but only `relay install` took --key-file: `relay search x --url U
    --key-file F` said "No such option '--key-file'", which left --key, shown by ps and
    kept in the shell's history. Every client command reads it as install does: the first
    line, beating RELAY_API_KEY; beside --key, or empty, refused in one line."""
    key_file = tmp_path / "relay.key"
    key_file.write_text(live_server.admin_key + "\n")
    given = ("--url", live_server.url, "--key-file", str(key_file))
    home = tmp_path / "nothing-installed"  # the file is the only key there is
    home.mkdir()
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "AGENTS.md").write_text("# Key files\n\nKey-file test: canaries run in eu-west-3.\n")
    body = "Key-file test: the billing canary runs in eu-west-3."
    made = relay(home, "remember", body, "--source", "qa/key-file", *given)
    assert made.returncode == 0, made.stderr
    memory_id = made.stdout.split()[1]
    exported = str(tmp_path / "out.jsonl")
    for args in (
        ("search", "where does the billing canary run?"),
        ("edit", memory_id, "--tag", "canary"),
        ("history", memory_id),
        ("import", str(notes), "--root", str(notes), "--source-prefix", "qa-key-file"),
        ("export", "-o", exported),
        ("restore", exported),
        ("forget", memory_id),
    ):
        done = relay(home, *args, *given, RELAY_API_KEY="relay_x_" + "y" * 24)
        assert done.returncode == 0, (args, done.stderr)
    revisions = json.loads(relay(home, "history", memory_id, "--json", *given).stdout)
    assert [(r["action"], r["tags"]) for r in revisions][1:] == [
        ("edit", ["canary"]),
        ("delete", []),
    ]

    both = relay(home, "search", "canary", *given, "--key", live_server.admin_key)
    assert (both.returncode, both.stderr) == (
        2,
        "relay: error: give --key or --key-file, not both (see 'relay search --help')\n",
    )
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    done = relay(home, "search", "canary", "--url", live_server.url, "--key-file", str(empty))
    assert (done.returncode, done.stderr) == (
        2,
        f"relay: error: the key file {empty} is empty: the API key goes on its first line\n",
    )


def test_relay_url_spelling_the_installed_server_otherwise_keeps_its_key(home, live_server):
    """The installed server however RELAY_URL spells it: a trailing slash, a path, the
    host's case, localhost for 127.0.0.1."""
    port = live_server.url.rsplit(":", 1)[1]
    for spelled in (
        live_server.url + "/",
        f"HTTP://127.0.0.1:{port}",
        f"http://localhost:{port}/",
    ):
        done = relay(home, "search", "how do we deploy?", RELAY_URL=spelled)
        assert done.returncode == 0, (spelled, done.stderr)


def test_the_hook_sends_the_installed_key_to_no_other_server(home, live_server):
    """The hook, as an agent runs it with RELAY_URL=OTHER exported: nothing on stdout or
    stderr, exit 0, no connection to OTHER, and a log line saying why."""
    command = registered_command(home / ".claude/settings.json", "UserPromptSubmit")
    log = home / ".relay/state/outcomes.jsonl"
    with FakeRelay() as other:
        run = run_registered(command, home, PROMPT, extra_env={"RELAY_URL": other.url})
        assert (run.returncode, run.stdout, run.stderr) == (0, b"", b"")
        assert other.connections == 0
    entry = json.loads(log.read_text().splitlines()[-1])
    assert (entry["outcome"], entry["reason"], entry["url"]) == (
        "disabled",
        "key_elsewhere",
        other.url,
    )
    # the installed server however spelled: searched with the installed key
    port = live_server.url.rsplit(":", 1)[1]
    again = {**PROMPT, "session_id": "key-home-2"}
    run = run_registered(command, home, again, extra_env={"RELAY_URL": f"http://localhost:{port}/"})
    assert run.returncode == 0 and run.stderr == b""
    entry = json.loads(log.read_text().splitlines()[-1])
    assert entry["outcome"] in ("hit", "no_match"), entry


def test_doctor_and_install_name_the_key_relay_url_does_not_get(home, live_server):
    """doctor words the hook's refusal, and probes that server with no key (whether it is
    up needs none); `relay install` with RELAY_URL naming another server asks for that
    server's key instead of sending the installed one, and connects to nothing."""
    with FakeRelay() as other:
        found = json.loads(relay(home, "doctor", "--json", RELAY_URL=other.url).stdout)
        assert other.requests and not any("authorization" in r.headers for r in other.requests)
        # the fake answers every probe as no Relay does: said about the server, apart
        server, failed = [f for f in found if f["level"] == "fail"]
        assert server["area"] == "server" and "is not a Relay server root" in server["message"]
        assert (failed["area"], failed["message"], failed["fix"]) == (
            "key",
            f"{refused(f'RELAY_URL ({other.url})', live_server.url)}: the hook sends no key,"
            " and no prompt gets recall",
            "unset RELAY_URL, or set RELAY_API_KEY_FILE to a file holding that server's key",
        )
        other.connections = 0
        done = relay(home, "install", RELAY_URL=other.url)
        # review: it said "pass --key", which install then refused for want of --url
        assert done.returncode == 2 and done.stderr == (
            f"relay: error: {refused(f'RELAY_URL ({other.url})', live_server.url)}: pass --url"
            f" {other.url} --key-file FILE (or set RELAY_API_KEY_FILE) for that server, or"
            " unset RELAY_URL (see 'relay install --help')\n"
        )
        assert other.connections == 0
        key_file = home / "other.key"
        key_file.write_text("relay_k_" + "3" * 24 + "\n")
        done = relay(
            home, "install", "--url", other.url, "--key-file", str(key_file), RELAY_URL=other.url
        )
        assert "RELAY_URL in the environment names" not in done.stderr, done.stderr
        assert other.connections > 0  # as advised: that server asked, with that key only
        assert sent_keys(other)[-1] == "Bearer relay_k_" + "3" * 24


def test_install_given_a_key_moves_to_no_server_a_stale_relay_url_names(home, live_server):
    """QA: after `relay install --url A --key K1`, `relay install --key K2` in a shell with a
    stale RELAY_URL=B exported sent K2 to B and moved the install there, saying nothing of
    where B came from. It is refused, connecting to nothing, unless --url says B is meant;
    a RELAY_URL install goes ahead saying on stderr that the URL is RELAY_URL's."""
    config = home / ".relay/config.json"
    before = config.read_bytes()
    with FakeRelay() as other:
        done = relay(home, "install", "--key", "relay_k_" + "2" * 24, RELAY_URL=other.url)
        assert (done.returncode, done.stdout, done.stderr) == (
            2,
            "",
            f"relay: error: RELAY_URL in the environment names {other.url}, not the server"
            f" installed ({live_server.url}): pass --url {other.url} to install against it, or"
            f" unset RELAY_URL to keep {live_server.url} (see 'relay install --help')\n",
        )
        assert other.connections == 0 and config.read_bytes() == before
    note = "relay: note: server {}, from RELAY_URL in the environment (--url to change it)\n"
    spelled = live_server.url + "/"  # the installed server, spelled otherwise
    done = relay(home, "install", "--key", live_server.admin_key, RELAY_URL=spelled)
    assert (done.returncode, done.stderr) == (0, note.format(spelled))
    fresh = home / "fresh"  # nothing installed: RELAY_URL's server, said to be
    fresh.mkdir()
    done = relay(fresh, "install", "--key", live_server.admin_key, RELAY_URL=live_server.url)
    assert (done.returncode, done.stderr) == (0, note.format(live_server.url))
    assert f"Connected to {live_server.url}:" in done.stdout


@pytest.mark.parametrize(
    ("url", "other", "same"),
    [
        ("http://relay:80", "http://RELAY./", True),
        ("https://relay", "https://relay:443/team", True),
        ("http://localhost:8765", "http://127.0.0.1:8765", True),
        ("http://[::1]:8765", "http://localhost:8765/", True),
        ("http://127.0.0.1:8765", "http://[::1]:8765", False),  # two sockets
        ("https://relay", "http://relay:443", False),  # the key in clear text
        ("http://relay:8765", "http://relay:8766", False),
        ("http://relay", "http://relay.evil.example", False),
        ("http://relay", "http://user@relay", False),  # no URL the hook takes
    ],
)
def test_same_server(url, other, same):
    assert same_server(url, other) is same and same_server(other, url) is same


def test_bench_hook_reads_its_key_from_a_key_file(tmp_path):
    """QA: the README says every command that takes --key takes --key-file; `relay bench
    hook --url U` took only --key. Its --key-file is read and checked as every other's."""
    empty = tmp_path / "empty.key"
    empty.write_text("")
    with FakeRelay() as other:
        done = relay(tmp_path, "bench", "hook", "--url", other.url, "--key-file", str(empty))
        assert other.connections == 0
    assert done.returncode == 2
    assert done.stderr == (
        f"relay: error: the key file {empty} is empty: the API key goes on its first line\n"
    )
