"""`relay remember`, `relay edit` and `relay key create` as a user types them, against the
in-process API over both stores (the `api` fixture): what the server refuses, the CLI
reports in one line."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner, Result
from postgres_support import execute_beneath

from relay import client as relay_client
from relay.cli import cli
from relay.errors import InvalidRequestError, RelayError


@pytest.fixture
def relay(api, monkeypatch):
    """Run `relay ARGS` as `who`; its HTTP requests go to the in-process app."""

    def request(self, method: str, path: str, body=None):  # noqa: ANN001, ANN202
        headers = {"Authorization": f"Bearer {self.api_key}"}
        r = api.client.request(method, path, json=body, headers=headers)
        if r.status_code >= 400:
            err = r.json()["error"]
            raise relay_client._BY_CODE.get(err["code"], RelayError)(err["message"])
        return r.json() if r.content else None

    monkeypatch.setattr(relay_client.RelayClient, "request", request)

    def run(who: str, *args: str) -> Result:
        command, *rest = args
        given = [command, *rest, "--url", "http://relay.test", "--key", api.keys[who]]
        return CliRunner().invoke(cli, given, standalone_mode=False)

    return run


def refused(result: Result) -> str:
    """The message `relay` prints for the RelayError the command ended with."""
    assert isinstance(result.exception, RelayError), (result.output, result.exception)
    return result.exception.message


def test_remember_reads_valid_until_as_iso_8601_never_as_a_unix_time(relay, api):
    """QA: `relay remember --valid-until 1893456000` was stored as 2030-01-01."""
    said = refused(relay("acme_dev", "remember", "Freeze at noon.", "--valid-until", "1893456000"))
    assert said.startswith("valid_until: '1893456000' is not an ISO 8601 date or time"), said
    assert "2027-01-31" in said  # an example of what to write
    done = relay("acme_dev", "remember", "Freeze at noon.", "--valid-until", "20310101", "--json")
    assert done.exception is None, done.output
    assert '"valid_until": "2031-01-01T00:00:00Z"' in done.output


def database(api) -> str:
    """What `--db` names for the fixture's store: its SQLite file or its PostgreSQL URL."""
    store = api.services.store
    return getattr(store, "url", None) or store.path


def test_key_create_names_roles_like_audiences(api):
    """QA: `relay key create --role Platform` made a key no memory could address (audiences
    are lower-cased); it is now the role platform, and a name that is no audience name is
    refused with what to write instead."""
    base = ["key", "create", "--org", "acme", "--name", "platform ci", "--db", database(api)]
    done = CliRunner().invoke(cli, [*base, "--role", "Platform"], standalone_mode=False)
    assert done.exception is None, done.output
    assert "roles: platform)" in done.output
    bad = CliRunner().invoke(cli, [*base, "--role", "Ops Team"], standalone_mode=False)
    assert "did you mean 'ops-team'?" in refused(bad)
    roles = [k.roles for k in api.services.store.list_keys(api.orgs["acme"])]
    assert frozenset({"platform"}) in roles and frozenset({"ops team"}) not in roles


def test_edit_can_remove_valid_until(relay, api):
    """QA: `relay edit` could not clear valid_until at all, and `--valid-until ""` printed a
    raw pydantic error."""
    made = relay("acme_dev", "remember", "Freeze at noon.", "--valid-until", "2099-01-01")
    memory_id = made.output.split()[1]
    blank = relay("acme_dev", "edit", memory_id, "--valid-until", "")
    assert "--valid-until needs an ISO 8601 date or time" in str(blank.exception)
    assert "--no-valid-until" in str(blank.exception)
    both = relay("acme_dev", "edit", memory_id, "--valid-until", "2099-02-01", "--no-valid-until")
    assert "not both" in str(both.exception)
    done = relay("acme_dev", "edit", memory_id, "--no-valid-until")
    assert done.exception is None and "revision 2" in done.output, done.output
    got = api.client.get(f"/v1/memories/{memory_id}", headers=api.headers("acme_dev")).json()
    assert got["valid_until"] is None and got["body"] == "Freeze at noon."


def test_edit_can_remove_tags_and_supersedes(relay, api):
    """`relay edit` could not clear tags or supersedes (the API can, with null or []):
    --no-tags and --no-supersedes do, and the superseded memory is recalled again."""
    old = relay("acme_dev", "remember", "Deploys go out on Tuesdays.").output.split()[1]
    made = relay(
        "acme_dev",
        "remember",
        "Deploys go out on Thursdays.",
        "--tag",
        "deploy",
        "--tag",
        "ci",
        "--supersedes",
        old,
    )
    memory_id = made.output.split()[1]
    headers = api.headers("acme_dev")

    def recalled() -> list[str]:
        query = {"query": "when do deploys go out?"}
        return [
            h["id"]
            for h in api.client.post("/v1/search", json=query, headers=headers).json()["results"]
        ]

    assert old not in recalled() and memory_id in recalled()
    both = relay("acme_dev", "edit", memory_id, "--tag", "x", "--no-tags")
    assert "give --tag or --no-tags, not both" in str(both.exception)
    both = relay("acme_dev", "edit", memory_id, "--supersedes", old, "--no-supersedes")
    assert "give --supersedes or --no-supersedes, not both" in str(both.exception)
    done = relay("acme_dev", "edit", memory_id, "--no-tags", "--no-supersedes")
    assert done.exception is None and "revision 2" in done.output, done.output
    got = api.client.get(f"/v1/memories/{memory_id}", headers=headers).json()
    assert got["tags"] == [] and got["supersedes"] == [], got
    assert got["body"] == "Deploys go out on Thursdays."
    assert old in recalled()


def test_key_list_warns_of_roles_made_before_they_were_checked(api):
    """Keys made before roles were held to the audience rule keep roles no memory can name;
    `relay key list` says which, and what to do, on stderr (its listing stays parseable)."""
    org = api.orgs["acme"]
    store = api.services.store
    store.create_key(
        org,
        "0a0b0c0d0e0f",
        "h",
        "old ci",
        frozenset({"memory:read"}),
        frozenset({"Platform", "ops team", "sre"}),
        None,
    )
    done = CliRunner().invoke(cli, ["key", "list", "--org", "acme", "--db", database(api)])
    assert done.exit_code == 0, done.output
    assert "0a0b0c0d0e0f\tactive\told ci\tmemory:read\tPlatform,ops team,sre" in done.stdout
    warned = [line for line in done.stderr.splitlines() if "0a0b0c0d0e0f" in line]
    head = (
        "warning: key 0a0b0c0d0e0f holds a role no memory can name, so it reads only what is"
        " for all: "
    )
    tail = " Create a key with the role you meant and revoke this one."
    assert warned == [
        f"{head}role 'Platform' is not lower-case, as audiences are; did you mean 'platform'?"
        f"{tail}",
        f"{head}role 'ops team' is not a valid name (lowercase letters, digits, '_', '.', '-'; at"
        " most 64 characters; it is what a memory's audiences name); did you mean 'ops-team'?"
        f"{tail}",
    ], done.stderr
    assert not [
        line
        for line in done.stderr.splitlines()
        if "warning" in line and "0a0b0c0d0e0f" not in line
    ]


def test_an_id_is_sent_whole_never_read_as_part_of_the_url(relay, api):
    """QA: `relay forget "$ID?oops"` deleted $ID and printed "forgot $ID?oops"; `relay history
    "x#y"` read x; `relay edit "bad id!"` was a traceback (http.client.InvalidURL)."""
    memory_id = relay("acme_dev", "remember", "Throwaway note.").output.split()[1]
    for args in (
        ("forget", f"{memory_id}?oops"),
        ("forget", f"{memory_id}#oops"),
        ("history", f"{memory_id}#y"),
        ("edit", "bad id!", "--body", "x"),
        ("forget", f"../{memory_id}"),
    ):
        said = refused(relay("acme_dev", *args))
        assert said.startswith("no memory "), (args, said)
    headers = api.headers("acme_dev")
    assert api.client.get(f"/v1/memories/{memory_id}", headers=headers).status_code == 200


def test_a_server_url_that_is_no_url_is_one_line():
    """QA: `relay search staging --url "not a url"` was a ValueError traceback."""
    done = CliRunner().invoke(
        cli,
        ["search", "staging", "--url", "not a url", "--key", "relay_k_s"],
        standalone_mode=False,
    )
    assert isinstance(done.exception, RelayError), done.exception
    assert done.exception.message == (
        "'not a url' is not a Relay server URL: give http://host:port (or https://...)"
    )


def test_a_key_expiry_beyond_any_date_is_refused_as_a_usage_error(api):
    """QA: `relay key create --expires-in-days 99999999` was an OverflowError traceback."""
    base = ["key", "create", "--org", "acme", "--name", "ci", "--db", database(api)]
    done = CliRunner().invoke(cli, [*base, "--expires-in-days", "99999999"])
    assert done.exit_code == 2 and "36500" in done.output, done.output


def test_key_list_names_its_columns_and_each_keys_expiry_and_revoke_says_when_it_was_done(api):
    """QA: `relay key list` had no header and no expiry column; revoking a revoked key again
    printed "revoked" as if it had just been done."""
    base = ["--org", "acme", "--db", database(api)]
    made_on = datetime.now(UTC).date()
    made = CliRunner().invoke(
        cli, ["key", "create", *base, "--name", "contractor", "--expires-in-days", "30"]
    )
    # The day it was made, as read before and after: one that ends between them is either.
    days = {str(day + timedelta(days=30)) for day in (made_on, datetime.now(UTC).date())}
    key_id = made.output.split("relay_")[1].split("_")[0]
    listed = CliRunner().invoke(cli, ["key", "list", *base]).stdout.splitlines()
    assert listed[0] == "id\tstate\tname\tscopes\troles\texpires"
    row = next(line.split("\t") for line in listed if line.startswith(key_id))
    assert row[1:3] == ["active", "contractor"] and row[5][:10] in days, row
    first = CliRunner().invoke(cli, ["key", "revoke", *base, key_id])
    assert first.output == f"revoked {key_id}\n"
    again = CliRunner().invoke(cli, ["key", "revoke", *base, key_id])
    assert again.exit_code == 0 and again.output.startswith(f"{key_id} was already revoked, at ")


def test_key_list_of_an_unknown_org_prints_no_header_before_its_error(api):
    """QA: `relay key list --org nosuch` printed the table header on stdout, then the error."""
    done = CliRunner().invoke(cli, ["key", "list", "--org", "nosuch", "--db", database(api)])
    assert done.stdout == ""
    assert isinstance(done.exception, RelayError), done.exception
    assert done.exception.message == "no organisation 'nosuch' (see 'relay org list')"


def test_history_says_what_else_each_revision_changed(relay, api):
    """QA: `relay history` printed only the body, so a revision that changed a tag or the
    source looked like the one before it."""
    made = relay("acme_dev", "remember", "Deploys go out on Tuesdays.", "--source", "team/ops")
    memory_id = made.output.split()[1]
    relay("acme_dev", "edit", memory_id, "--tag", "deploy")
    relay("acme_dev", "edit", memory_id, "--source", "team/release", "--no-tags")
    shown = relay("acme_dev", "history", memory_id).output.splitlines()
    # QA: a revision with no title ended its line in a blank field ("...07:04:46Z  ").
    assert re.fullmatch(r"rev 1  create \S+Z", shown[0]), shown[0]
    assert shown[1:3] == [
        "    Deploys go out on Tuesdays.",
        "    (source: team/ops; audiences: all)",
    ]
    assert shown[4:6] == ["    Deploys go out on Tuesdays.", "    (tags: deploy)"]
    assert shown[7:9] == [
        "    Deploys go out on Tuesdays.",
        "    (source: team/release; tags: none)",
    ]
    assert len(shown) == 9
    # QA: a superseded memory's history never said so, nor by which memory
    newer = relay("acme_dev", "remember", "Deploys go out on Fridays.", "--supersedes", memory_id)
    newer_id = newer.output.split()[1]
    shown = relay("acme_dev", "history", memory_id).output.splitlines()
    assert shown[9:] == [
        f"superseded by {newer_id}: recall no longer returns this memory"
        f" ('relay history {newer_id}' shows what replaced it)"
    ]
    body = "Deploys go out on Fridays.\n\nNever on a holiday."
    relay("acme_dev", "edit", newer_id, "--title", "Deploy day", "--body", body)
    shown = relay("acme_dev", "history", newer_id).output.splitlines()
    assert [line for line in shown if line != line.rstrip()] == []
    assert re.fullmatch(r"rev 2  edit   \S+Z  Deploy day", shown[3]), shown[3]
    assert shown[4:7] == ["    Deploys go out on Fridays.", "", "    Never on a holiday."]


def test_history_says_which_revisions_pinned_and_unpinned_the_memory(relay, api):
    """QA: a pin or unpin is a new revision, and revisions kept no pin: `relay history`
    showed a revision that changed nothing. Each says it now, beside the other changes."""
    made = relay("acme_dev", "remember", "Deploys go out on Tuesdays.", "--pinned")
    memory_id = made.output.split()[1]
    relay("acme_dev", "edit", memory_id, "--not-pinned")
    relay("acme_dev", "edit", memory_id, "--pinned", "--tag", "deploy")
    relay("acme_dev", "edit", memory_id, "--body", "Deploys go out on Wednesdays.")
    shown = relay("acme_dev", "history", memory_id).output.splitlines()
    assert shown[2::3] == [
        "    (audiences: all; pinned)",
        "    (unpinned)",
        "    (tags: deploy; pinned)",
    ]
    assert len(shown) == 11  # the last revision changed the body alone: no line of changes
    items = json.loads(relay("acme_dev", "history", memory_id, "--json").output)
    assert [r["pinned"] for r in items] == [True, False, True, True]
    # Revisions recorded before they kept the pin (store migration 8 could not tell): one
    # that changed nothing else changed the pin, which way unknown.
    _forget_pins(api.services.store)
    shown = relay("acme_dev", "history", memory_id).output.splitlines()
    assert shown[2::3] == [
        "    (audiences: all)",
        "    (pinned or unpinned: recorded before revisions said which)",
        "    (tags: deploy)",
    ]


def _forget_pins(store) -> None:  # noqa: ANN001
    """Every revision's pin made unknown, beneath the store's API."""
    execute_beneath(store, "UPDATE memory_revisions SET pinned = NULL")


def test_remember_and_edit_warn_when_the_key_can_no_longer_read_the_memory(relay):
    """QA: `relay edit ID --audience sre` by a dev key said "ID is now at revision 2", and
    the key's next `relay history ID` was "no memory". Both commands pass on the server's
    warning, on stderr, and still succeed: writing for another team is allowed."""
    made = relay("acme_dev", "remember", "Canary deploys need two approvals.", "--audience", "dev")
    assert made.exception is None and made.stderr == "", made.output
    memory_id = made.stdout.split()[1]
    done = relay("acme_dev", "edit", memory_id, "--audience", "sre")
    assert done.exception is None, done.output
    assert done.stdout == f"{memory_id} is now at revision 2\n"
    assert done.stderr == (
        f"relay: warning: this key cannot read memory {memory_id} now: it is for sre, and the"
        " key reads all, dev; it is saved, but this key will not find, list or edit it again"
        " (a key with one of its audiences, or an admin key, can)\n"
    )
    made = relay("acme_dev", "remember", "The sre rota is in the wiki.", "--audience", "sre")
    assert made.exception is None and made.stdout.startswith("remembered "), made.output
    assert made.stderr.startswith("relay: warning: this key cannot read memory "), made.stderr


def test_a_body_on_stdin_that_is_not_utf8_is_said_so():
    """QA: `printf 'caf\\xe9' | relay remember -` said the body "contains an unpaired
    surrogate (\\udce9)"."""
    args = ["remember", "-", "--url", "http://127.0.0.1:9", "--key", "relay_k_s"]
    done = CliRunner().invoke(cli, args, input=b"caf\xe9", standalone_mode=False)
    assert isinstance(done.exception, InvalidRequestError), done.exception
    assert done.exception.message == "stdin is not UTF-8 text (byte 0xe9 at offset 3)"


def test_a_body_on_stdin_is_read_as_utf8(relay, api):
    args = ["remember", "-", "--url", "http://relay.test", "--key", api.keys["acme_dev"], "--json"]
    done = CliRunner().invoke(
        cli, args, input="Café menus are in é.\n".encode(), standalone_mode=False
    )
    assert done.exception is None, done.output
    assert json.loads(done.output)["body"] == "Café menus are in é."


def test_a_missing_key_says_how_to_give_one_and_sends_nothing(tmp_path):
    """QA: `HOME=/tmp/empty relay search foo --url URL` printed the server's hint for HTTP
    clients, "missing API key (send 'Authorization: Bearer <key>')", exit 3."""
    from hook_support import FakeRelay
    from integration_support import relay

    with FakeRelay() as server:
        done = relay(tmp_path, "search", "foo", "--url", server.url)
        assert server.connections == 0
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "relay: error: no API key: pass --key or --key-file, set RELAY_API_KEY (or"
        " RELAY_API_KEY_FILE), or run 'relay install'\n"
    )


@pytest.mark.parametrize(
    "content, said",
    [
        (
            b"\xef\xbb\xbfrelay_x_0123456789abcdef\n",
            "starts with a byte-order mark (the bytes EF BB BF, which some editors put at the"
            " start of a UTF-8 file): save {path} without the mark (as plain ASCII), {other}",
        ),
        (
            b"relay_x_0123 456789abcdef\n",
            "holds a space (character 13), which no key has: write the key alone on the first"
            " line of {path}, {other}",
        ),
        (
            b"relay_x_0123\x01456789abcdef\n",
            "holds '\\x01' (character 13), not printable ASCII: write the key alone on the"
            " first line of {path}, {other}",
        ),
        (None, "does not exist: write the API key on the first line of {path}, {other}"),
        ("directory", "is a directory: name the key file itself, {other}"),
    ],
)
def test_a_key_file_that_cannot_be_used_is_named_with_what_is_wrong(tmp_path, content, said):
    """QA: a key file with a byte-order mark, a space or a control character in its key,
    missing or unreadable, got "no API key: pass --key, set RELAY_API_KEY ...", as if none
    had been given: the user looked everywhere but at the file."""
    from hook_support import FakeRelay
    from integration_support import relay

    path = tmp_path / "my key"
    if content == "directory":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    with FakeRelay() as server:
        done = relay(tmp_path, "search", "foo", "--url", server.url, RELAY_API_KEY_FILE=str(path))
        assert server.connections == 0
    assert done.returncode == 2, done.stderr
    named = f"relay: error: the key file {path} (named by RELAY_API_KEY_FILE) "
    # QA: the fix said "or run `relay install --key KEY`, which writes the key file afresh",
    # but install writes ~/.relay/key, not the file the variable names; and a directory
    # was told "chmod 600 DIR".
    other = "or set RELAY_API_KEY_FILE to the right file, or unset it"
    assert done.stderr == named + said.format(path=path, other=other) + "\n"


def test_a_key_file_named_in_the_config_file_is_named_with_its_setting(tmp_path):
    from hook_support import FakeRelay
    from integration_support import relay

    (tmp_path / ".relay").mkdir()
    config = tmp_path / ".relay/config.json"
    config.write_text(json.dumps({"api_key_file": "~/.relay/key"}))
    (tmp_path / ".relay/key").write_text("relay_x_0123456789abcdéf\n")
    with FakeRelay() as server:
        done = relay(tmp_path, "search", "foo", "--url", server.url)
        assert server.connections == 0
    assert done.stderr == (
        f"relay: error: the key file {tmp_path}/.relay/key (named by api_key_file in {config})"
        " holds 'é' (character 23), not printable ASCII: write the key alone on the first"
        f" line of {tmp_path}/.relay/key, or run `relay install --key-file FILE`, which writes"
        " the key file afresh\n"
    )


@pytest.mark.parametrize(
    "how, said",
    [
        ("--key-file", "the key file {path} starts with a byte-order mark"),
        ("RELAY_API_KEY", "the API key in RELAY_API_KEY starts with a byte-order mark"),
        ("--key", "the API key given by --key holds '€' (character 25), not printable ASCII"),
    ],
)
def test_a_key_given_that_cannot_be_sent_is_refused_in_one_line(tmp_path, how, said):
    """QA: a key with a byte-order mark or a character not ASCII, given by --key-file,
    RELAY_API_KEY or --key, crashed every command with http.client's UnicodeEncodeError
    traceback; RELAY_API_KEY_FILE's was already refused in words. Now all four alike."""
    from hook_support import FakeRelay
    from integration_support import relay

    key = "relay_x_0123456789abcdef"
    path = tmp_path / "bom.key"
    path.write_bytes(b"\xef\xbb\xbf" + key.encode() + b"\n")
    given = {
        "--key-file": (("--key-file", str(path)), {}),
        "RELAY_API_KEY": ((), {"RELAY_API_KEY": "\ufeff" + key}),
        "--key": (("--key", key + "€€"), {}),
    }
    args, env = given[how]
    with FakeRelay() as server:
        done = relay(tmp_path, "search", "staging", "--url", server.url, *args, **env)
        assert server.connections == 0
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("relay: error: " + said.format(path=path)), done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["forget", "edit"])
def test_an_expected_revision_below_one_is_refused_before_sending(tmp_path, command):
    """QA: `relay forget ID --expected-revision 0` printed the server's
    "query.expected_revision: Input should be greater than or equal to 1"."""
    from hook_support import FakeRelay
    from integration_support import relay

    edits = ("--title", "x") if command == "edit" else ()
    with FakeRelay() as server:
        done = relay(
            tmp_path,
            command,
            "mem_0123456789",
            *edits,
            "--expected-revision",
            "0",
            "--url",
            server.url,
            "--key",
            "relay_x_0123456789abcdef",
        )
        assert server.connections == 0
    assert done.returncode == 2, done.stderr
    assert "--expected-revision" in done.stderr and "0 is not in the range x>=1" in done.stderr


def test_search_says_when_the_server_had_no_time_to_search(tmp_path):
    """QA: `relay search` printed "nothing relevant", exit 0, for the server's answer to a
    search it had no time for (`degraded`, no stages, no results): one line on stderr and
    exit 8, as for a server away; a lexical-only answer with results is still listed."""
    from hook_support import FakeRelay, record, reply
    from integration_support import relay

    starved = {"results": [], "stages": [], "degraded": True, "cached": False, "took_ms": 0.1}
    with FakeRelay(reply(200, starved)) as server:
        done = relay(tmp_path, "search", "staging", "--url", server.url, "--key", "relay_k_x")
    assert (done.returncode, done.stdout) == (8, ""), done.stderr
    assert done.stderr == (
        "relay: error: the Relay server ran out of time before it could search, so nothing"
        " was searched (it may be busy)\n"
    )
    lexical = {**starved, "stages": ["lexical"], "results": [record("mem_a", text="Blue.")]}
    with FakeRelay(reply(200, lexical)) as server:
        done = relay(tmp_path, "search", "staging", "--url", server.url, "--key", "relay_k_x")
    assert done.returncode == 0 and "mem_a rev 1" in done.stdout and "Blue." in done.stdout
    with FakeRelay(reply(200, {**starved, "degraded": False, "stages": ["lexical"]})) as server:
        done = relay(tmp_path, "search", "staging", "--url", server.url, "--key", "relay_k_x")
    assert (done.returncode, done.stdout) == (0, "nothing relevant\n"), done.stderr


def test_search_reads_an_answer_as_the_hook_checks_it(tmp_path):
    """`relay search` against a server answering results without a score (or text) ended in
    a KeyError traceback: a flawed answer is one line naming the flaw, and a result the hook
    would take without a score (it is optional) is listed."""
    from hook_support import FakeRelay, record, reply
    from integration_support import relay

    with FakeRelay(reply(200, {"results": [{"id": "x", "revision": 1}]})) as server:
        done = relay(tmp_path, "search", "staging", "--url", server.url, "--key", "relay_k_x")
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    assert done.stderr == (
        "relay: error: the Relay server sent a malformed answer"
        " (results[].text is not a string of sane size)\n"
    )
    scoreless = record("mem_a", text="Blue.", score=None, title=None, source=None)
    with FakeRelay(reply(200, {"results": [scoreless]})) as server:
        done = relay(tmp_path, "search", "staging", "--url", server.url, "--key", "relay_k_x")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[-] mem_a rev 1  unknown  \n    Blue.\n"


def test_a_url_that_is_not_the_servers_root_says_so(tmp_path, live_server):
    """QA: `relay search foo --url http://host:port/v1` said "relay: error: Not Found" (exit
    4): the route missing, not a memory. As `relay install` says it, with what to give."""
    from hook_support import FakeRelay, reply
    from integration_support import relay

    url, key = live_server.url, live_server.admin_key
    done = relay(tmp_path, "search", "foo", "--url", f"{url}/v1", "--key", key)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"relay: error: {url}/v1 is likely not a Relay server root: POST {url}/v1/v1/search got"
        f" 404 Not Found; give its root, {url}, without /v1\n"
    )
    with FakeRelay(reply(404, b"<html>nothing here</html>")) as other:
        done = relay(tmp_path, "search", "foo", "--url", other.url, "--key", key)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(
        f"relay: error: {other.url} is not a Relay server root: POST {other.url}/v1/search got"
        " 404 Not Found; give the root URL"
    )
    gone = relay(tmp_path, "forget", "no-such-memory", "--url", url, "--key", key)
    assert gone.returncode == 4, gone.stderr  # a memory missing is still a memory missing


def test_a_server_answering_json_200_to_everything_is_not_relays(tmp_path):
    """QA: a web server answering {"status":"ok","data":[]} to every request made `relay
    search`, `remember` and `export` crash with a KeyError traceback ('results', 'id',
    'items'): the answer is checked once, in the client, against what Relay's holds."""
    from hook_support import FakeRelay, reply
    from integration_support import relay

    with FakeRelay(reply(200, {"status": "ok", "data": []})) as other:
        for args, request in (
            (("search", "foo"), "POST {}/v1/search"),
            (("remember", "a fact"), "POST {}/v1/memories"),
            (("export", "-o", str(tmp_path / "out.jsonl")), "GET {}/v1/memories"),
            # reviewer: forget said "forgot abc" (a DELETE answers 204, no body, at Relay);
            # it reads the memory first (what it supersedes), so that is what is refused
            (("forget", "abc"), "GET {}/v1/memories/abc"),
            (("stats", "--send"), "POST {}/v1/hook-outcomes"),
        ):
            given = {"RELAY_URL": other.url, "RELAY_API_KEY": "relay_k_" + "x" * 16}
            if args[0] != "stats":  # stats --send takes the installed server, or these
                args = (*args, "--url", other.url, "--key", given.pop("RELAY_API_KEY"))
                given.pop("RELAY_URL")
            done = relay(tmp_path, *args, **given)
            assert done.returncode == 2, done.stderr
            assert done.stderr == (
                f"relay: error: {other.url} is not a Relay server root: "
                f"{request.format(other.url)} got an answer that is not Relay's; give the root"
                " URL `relay serve` prints (the one /healthz and /v1/... are under)\n"
            )


@pytest.mark.parametrize(
    ("status", "answer"), [(501, "501 Not Implemented"), (405, "405 Method Not Allowed")]
)
def test_a_server_refusing_the_method_outside_relays_shape_is_not_relays(tmp_path, status, answer):
    """QA: `relay search` against `python3 -m http.server` said "HTTP 501 from the server":
    a 404, 405 or 501 without Relay's error body is some other web server."""
    from hook_support import FakeRelay, reply
    from integration_support import relay

    with FakeRelay(reply(status, b"<html>Unsupported method ('POST')</html>")) as other:
        done = relay(tmp_path, "search", "foo", "--url", other.url, "--key", "relay_k_x")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(
        f"relay: error: {other.url} is not a Relay server root: POST {other.url}/v1/search got"
        f" {answer}; give the root URL"
    )


def test_a_proxys_own_error_is_not_said_to_be_another_server():
    """A 502-504 page is what a proxy sends while the Relay server behind it is away."""
    from hook_support import FakeRelay, reply

    from relay.mcp_server import tool_error_message

    for status in (502, 503, 504):
        with FakeRelay(reply(status, b"<html>Bad Gateway</html>")) as proxy:
            with pytest.raises(RelayError) as failed:
                relay_client.RelayClient(proxy.url, "relay_k_x").post("/v1/search", {"q": "x"})
        assert failed.value.message == f"HTTP {status} from the server"
        # QA: it was a bare RelayError, so the MCP tool said "Relay error: HTTP 502 from the
        # server" where an unreachable server tells the agent to carry on without memory, and
        # `relay remember` through a proxy that gave up (504) never said it may have written.
        assert isinstance(failed.value, relay_client.ConnectionFailedError)
        assert "carry on without it" in tool_error_message(failed.value)
        with FakeRelay(reply(status, b"<html>Gateway</html>")) as proxy:
            with pytest.raises(RelayError) as write:
                relay_client.RelayClient(proxy.url, "relay_k_x").post("/v1/memories", {"b": 1})
        maybe = "" if status == 503 else "; it may still have written this request"
        assert write.value.message == f"HTTP {status} from the server{maybe}"
        assert write.value.sent is (status != 503)


def test_a_request_refused_at_connect_was_not_sent():
    """Reviewer: a server down mid-import was said to maybe still write the batch in flight
    ("and 128 more sent that the server may still write") though the connection was refused."""
    import socket

    from relay.cli.common import maybe_written
    from relay.client import ConnectionFailedError, RelayClient

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    client = RelayClient(f"http://127.0.0.1:{port}", "relay_k_" + "x" * 16)
    with pytest.raises(ConnectionFailedError) as refused:
        client.post("/v1/memories/batch", {"items": []})
    assert refused.value.sent is False
    assert maybe_written(128, refused.value) == ""
    assert maybe_written(128, None) == ", and 128 more sent that the server may still write"


def test_the_installed_key_is_not_sent_to_another_server_named_by_url(tmp_path):
    """QA: `--url` sent the installed key to whatever host it named (a typo, a pasted link
    would hand that host the team's memories). Another server needs its own --key."""
    from hook_support import FakeRelay
    from integration_support import relay

    key = "relay_k_" + "x" * 24
    (tmp_path / ".relay").mkdir()
    config = tmp_path / ".relay/config.json"
    with FakeRelay() as installed, FakeRelay() as other:
        config.write_text(json.dumps({"url": installed.url + "/", "api_key": key}))
        done = relay(tmp_path, "search", "foo", "--url", other.url)
        assert other.connections == 0
        assert done.returncode == 2, done.stderr
        assert done.stderr == (
            f"relay: error: {other.url} is not the server this machine's key is for"
            f" ({installed.url}/): pass --key or --key-file (or set RELAY_API_KEY_FILE or"
            " RELAY_API_KEY) for that server\n"
        )
        relay(tmp_path, "search", "foo", "--url", installed.url)  # the same server: sent
        relay(tmp_path, "search", "foo", "--url", other.url, "--key", key)  # its own key
        assert (installed.connections, other.connections) == (1, 1)


def test_a_key_file_named_in_the_environment_goes_to_the_server_url_names(tmp_path):
    """Review: `--url OTHER` was refused with RELAY_API_KEY_FILE naming the key in this
    shell, the user's own choice for it, and the refusal said to set RELAY_API_KEY. Only
    the installed config's key is kept to the installed server."""
    from hook_support import FakeRelay
    from integration_support import relay

    installed_key, chosen = "relay_k_" + "x" * 24, "relay_c_" + "y" * 24
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/key").write_text(installed_key + "\n")
    (tmp_path / "chosen.key").write_text(chosen + "\n")
    with FakeRelay() as installed, FakeRelay() as other:
        config = {"url": installed.url, "api_key_file": str(tmp_path / ".relay/key")}
        (tmp_path / ".relay/config.json").write_text(json.dumps(config))
        by_env = {"RELAY_API_KEY_FILE": str(tmp_path / "chosen.key")}
        done = relay(tmp_path, "search", "foo", "--url", other.url, **by_env)
        assert done.returncode == 0, done.stderr
        assert [r.headers["authorization"] for r in other.requests] == [f"Bearer {chosen}"]
        refused = relay(tmp_path, "search", "foo", "--url", other.url)  # the installed key
        assert refused.returncode == 2 and "is not the server this machine's key is for" in (
            refused.stderr
        )
        assert (installed.connections, other.connections) == (0, 1)


def test_an_org_keeps_an_admin_key_over_http_and_in_the_cli(tmp_path):
    """QA: `DELETE /v1/keys/<own id>` with the org's only admin key answered 200, and the
    next request 401: no key could make or revoke keys again. Refused (409) over HTTP and
    in `relay key revoke` alike, until another admin key exists."""
    import httpx
    from conftest import start_server
    from integration_support import mint, relay

    server = start_server(tmp_path / "relay.db")
    try:
        own = server.admin_key.split("_")[1]
        headers = {"Authorization": f"Bearer {server.admin_key}"}
        said = (
            f"key {own} is this organisation's last live admin key: without it no key could"
            " create or revoke keys; create another admin key first, then revoke this one"
        )
        answer = httpx.delete(f"{server.url}/v1/keys/{own}", headers=headers, timeout=30)
        assert answer.status_code == 409, answer.text
        assert answer.json()["error"]["message"] == said
        assert httpx.get(f"{server.url}/v1/keys", headers=headers, timeout=30).status_code == 200
        args = ("key", "revoke", "--org", "acme", "--db", str(server.db), own)
        done = relay(tmp_path, *args)
        assert done.returncode == 5 and done.stdout == "", done.stdout
        assert done.stderr == f"relay: error: {said}\n"
        second = mint(server.url, server.admin_key, "second admin", ["admin"])
        assert relay(tmp_path, *args).stdout == f"revoked {own}\n"
        answer = httpx.delete(
            f"{server.url}/v1/keys/{second['id']}",
            headers={"Authorization": f"Bearer {second['secret']}"},
            timeout=30,
        )
        assert answer.status_code == 409, answer.text
    finally:
        server.stop()


def test_forget_says_which_memories_it_brings_back_into_recall(tmp_path, live_server):
    """QA: `relay forget B`, B superseding A, printed only "forgot B": A was back in recall
    without a word. A memory another still supersedes stays out, and goes unnamed."""
    from integration_support import relay

    given = ("--url", live_server.url, "--key", live_server.admin_key)

    def remember(body: str, *args: str) -> str:
        done = relay(tmp_path, "remember", body, *args, *given)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()[1]

    old = remember("Forget-test: the release train leaves on Tuesdays.")
    new = remember("Forget-test: the release train leaves on Wednesdays.", "--supersedes", old)
    done = relay(tmp_path, "forget", new, *given)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"forgot {new}; {old}, which it superseded, is back in recall (forget it too if it is"
        " out of date)\n"
    )
    found = relay(tmp_path, "search", "Forget-test release train", "--json", *given)
    assert old in [r["id"] for r in json.loads(found.stdout)["results"]]

    gone, kept = remember("Forget-test: staging is red."), remember("Forget-test: QA is blue.")
    first = remember("Forget-test: staging is green.", "--supersedes", gone, "--supersedes", kept)
    remember("Forget-test: QA is green.", "--supersedes", kept)
    done = relay(tmp_path, "forget", first, *given)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"forgot {first}; {gone}, which it superseded, is back in recall (forget it too if it"
        " is out of date)\n"
    )


def test_history_says_a_memory_past_its_valid_until_is_out_of_recall(tmp_path, live_server):
    """QA: `relay history` of a memory past its valid_until read like a current one (the
    date showed only beside the revision that set it), while a superseded one's says that
    recall leaves it out: an expired one's now says so too, and how to bring it back."""
    from integration_support import relay

    given = ("--url", live_server.url, "--key", live_server.admin_key)
    # Far enough ahead that `remember` (a CLI start-up, slow on a loaded CI machine: 2 s was
    # overrun at load 7) still sends a future date; the test then waits it out.
    until = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=6)
    stamp = until.isoformat().replace("+00:00", "Z")
    made = relay(
        tmp_path, "remember", "History-expiry: the freeze ends.", "--valid-until", stamp, *given
    )
    assert made.returncode == 0, made.stderr
    memory_id = made.stdout.split()[1]
    assert "expired" not in relay(tmp_path, "history", memory_id, *given).stdout
    time.sleep(max(0.0, (until - datetime.now(UTC)).total_seconds()) + 0.3)
    relay(tmp_path, "edit", memory_id, "--body", "History-expiry: the freeze ended.", *given)
    shown = relay(tmp_path, "history", memory_id, *given).stdout.splitlines()
    assert shown[-1] == (
        f"expired at {stamp}: recall no longer returns this memory ('relay edit {memory_id}"
        " --valid-until DATE' or '--no-valid-until' brings it back)"
    )
    relay(tmp_path, "edit", memory_id, "--no-valid-until", *given)
    assert "expired" not in relay(tmp_path, "history", memory_id, *given).stdout


def test_forget_at_a_revision_keeps_a_memory_edited_since(tmp_path, live_server):
    """`relay forget ID --expected-revision N`, as `relay edit` takes it: a memory edited
    since revision N is not deleted, and the error says the revision it is at."""
    from integration_support import relay

    given = ("--url", live_server.url, "--key", live_server.admin_key)
    done = relay(tmp_path, "remember", "Forget-at-test: the pager rota is weekly.", *given)
    memory_id = done.stdout.split()[1]
    edit = ("edit", memory_id, "--body", "Forget-at-test: the pager rota is fortnightly.")
    assert relay(tmp_path, *edit, *given).returncode == 0
    done = relay(tmp_path, "forget", memory_id, "--expected-revision", "1", *given)
    assert (done.returncode, done.stdout) == (5, "")
    assert done.stderr == f"relay: error: memory {memory_id!r} is at revision 2, not 1\n"
    shown = relay(tmp_path, "history", memory_id, *given)
    assert "fortnightly" in shown.stdout and "delete" not in shown.stdout
    done = relay(tmp_path, "forget", memory_id, "--expected-revision", "2", *given)
    assert (done.returncode, done.stdout) == (0, f"forgot {memory_id}\n")


def test_an_expected_revision_is_read_as_digits_alone(tmp_path, live_server):
    """QA: `relay forget ID --expected-revision 1_0` sent revision 10, and ' 1' or '+1'
    deleted the memory at revision 1: click's INT reads what Python's int() reads. An
    integer option is decimal digits alone (a minus first, for its range to judge), refused
    as any bad value is, before anything is sent."""
    from integration_support import relay

    given = ("--url", live_server.url, "--key", live_server.admin_key)
    done = relay(tmp_path, "remember", "Strict-int-test: the pager rota is weekly.", *given)
    memory_id = done.stdout.split()[1]
    for typed in ("1_0", " 1", "+1", "1 ", "\u0661", "0x1", "1.0"):
        done = relay(tmp_path, "forget", memory_id, "--expected-revision", typed, *given)
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        assert done.stderr == (
            f"relay: error: Invalid value for '--expected-revision': {typed!r} is not a valid"
            " integer (decimal digits only). (see 'relay forget --help')\n"
        )
    done = relay(tmp_path, "forget", memory_id, "--expected-revision", "-1", *given)
    assert done.returncode == 2 and "-1 is not in the range x>=1." in done.stderr, done.stderr
    assert relay(tmp_path, "history", memory_id, *given).returncode == 0  # not deleted
    done = relay(tmp_path, "forget", memory_id, "--expected-revision", "01", *given)
    assert (done.returncode, done.stdout) == (0, f"forgot {memory_id}\n"), done.stderr


def test_every_integer_option_is_strict():
    """Every integer option of every command reads digits alone (`StrictInt`), its range
    kept: none is left to click's INT, which a new option would get from `type=int` or a
    number as its default."""
    import click

    from relay.cli_types import StrictInt

    def params(command: click.Command, path: str):  # noqa: ANN202
        ctx = click.Context(command)
        for name in command.list_commands(ctx) if isinstance(command, click.Group) else ():
            yield from params(command.get_command(ctx, name), f"{path} {name}")
        yield from ((path, p) for p in command.params)

    found = {
        f"{path} {p.name}": p.type
        for path, p in params(cli, "relay")
        if isinstance(p.type, click.types.IntParamType)
    }
    assert "relay forget expected_revision" in found and "relay drill crash seed" in found
    assert {name for name, kind in found.items() if not isinstance(kind, StrictInt)} == set()
    bounds = {name: (kind.min, kind.max) for name, kind in found.items()}
    assert bounds["relay search k"] == (1, 12)
    assert bounds["relay key create expires_in_days"] == (1, 36500)
    assert bounds["relay drill crash seed"] == (None, None)


@pytest.mark.parametrize("command", [("remember", "A fact."), ("edit", "mem_x")])
def test_pinned_and_not_pinned_together_are_refused(tmp_path, command):
    """QA: `relay remember --pinned --not-pinned` was taken (the last won), while other
    contradictory flags are refused."""
    from hook_support import FakeRelay
    from integration_support import relay

    with FakeRelay() as server:
        args = (*command, "--pinned", "--not-pinned", "--url", server.url, "--key", "relay_k_x")
        done = relay(tmp_path, *args)
        assert server.connections == 0
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"relay: error: give --pinned or --not-pinned, not both (see 'relay {command[0]} --help')\n"
    )


def test_an_edit_that_changes_nothing_and_a_second_forget_say_so(tmp_path, live_server):
    """QA: `relay edit ID --body "<the same text>"` said "ID is now at revision 2", though
    the server made no revision; `relay forget ID` again said "no memory 'ID'" (exit 4) while
    `relay history ID` showed its tombstone. Both say what happened now, and forgetting a
    deleted memory exits 0, as the first did: a script that forgets twice has what it asked."""
    from integration_support import relay

    given = ("--url", live_server.url, "--key", live_server.admin_key)
    body = "Unchanged-edit test: the canary runs in eu-west-2."
    made = relay(tmp_path, "remember", body, "--source", "qa/unchanged-edit", *given)
    memory_id = made.stdout.split()[1]

    same = relay(tmp_path, "edit", memory_id, "--body", body, *given)
    assert (same.returncode, same.stdout) == (
        0,
        f"unchanged: {memory_id} is still at revision 1\n",
    ), same.stderr
    moved = relay(tmp_path, "edit", memory_id, "--body", body.replace("2", "3"), *given)
    assert moved.stdout == f"{memory_id} is now at revision 2\n", moved.stderr
    tagged = relay(tmp_path, "edit", memory_id, "--tag", "canary", *given)
    assert tagged.stdout == f"{memory_id} is now at revision 3\n", tagged.stderr
    again = relay(tmp_path, "edit", memory_id, "--tag", "canary", *given)
    assert again.stdout == f"unchanged: {memory_id} is still at revision 3\n", again.stderr

    assert relay(tmp_path, "forget", memory_id, *given).stdout == f"forgot {memory_id}\n"
    twice = relay(tmp_path, "forget", memory_id, *given)
    tombstone = json.loads(relay(tmp_path, "history", memory_id, "--json", *given).stdout)[-1]
    assert tombstone["action"] == "delete" and tombstone["revision"] == 4
    assert (twice.returncode, twice.stdout, twice.stderr) == (
        0,
        f"already deleted: {memory_id} was forgotten at {tombstone['recorded_at']} (revision 4)\n",
        "",
    )
    never = relay(tmp_path, "forget", "mem_unchanged_never_made", *given)
    assert (never.returncode, never.stderr) == (
        4,
        "relay: error: no memory 'mem_unchanged_never_made'\n",
    )
    # QA: an edit of it said "no memory 'ID'", as of one never made; it did not happen (4)
    edited = relay(tmp_path, "edit", memory_id, "--tag", "late", *given)
    assert (edited.returncode, edited.stdout, edited.stderr) == (
        4,
        "",
        f"relay: error: {memory_id} was forgotten at {tombstone['recorded_at']} (revision 4):"
        " a deleted memory cannot be edited (relay remember records a new one)\n",
    )
    never = relay(tmp_path, "edit", "mem_unchanged_never_made", "--tag", "late", *given)
    assert (never.returncode, never.stderr) == (
        4,
        "relay: error: no memory 'mem_unchanged_never_made'\n",
    )


def test_a_write_whose_answer_never_came_may_have_happened(tmp_path):
    """QA: a server that read a whole `relay remember` (or MCP team_memory_remember) and
    closed the connection without answering was said to be unreachable ("cannot reach the
    Relay server ...: Remote end closed connection"), so the user or agent wrote it again
    and the memory was stored twice; a read says only that no answer came."""
    from hook_support import FakeRelay
    from integration_support import relay

    with FakeRelay(lambda conn, request: None) as gone:
        done = relay(
            tmp_path,
            "remember",
            "Deploys freeze on Fridays.",
            "--url",
            gone.url,
            "--key",
            "relay_k_" + "x" * 24,
        )
        read = relay(
            tmp_path, "search", "deploy freeze", "--url", gone.url, "--key", "relay_k_" + "x" * 24
        )
    assert [r.method for r in gone.requests] == ["POST", "POST"]
    assert done.returncode == 8, done.stderr
    assert done.stderr == (
        f"relay: error: the Relay server at {gone.url} closed the connection without answering"
        " (Remote end closed connection without response); it may still have written this"
        " request\n"
    )
    assert read.stderr.startswith(
        f"relay: error: the Relay server at {gone.url} closed the connection without answering"
    )
    assert "written" not in read.stderr
