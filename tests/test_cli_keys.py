"""`relay org` and `relay key` as a user types them, as processes on a real database, and the
key routes of a real server: a whole key typed where a key id goes is never printed back, and
the first organisation made as docs/deployment.md says keeps `relay serve` from printing one."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import httpx
import pytest
from conftest import start_server
from integration_support import mint, relay
from postgres_support import truncate_all

DEPLOYMENT = Path(__file__).parent.parent / "docs/deployment.md"


def test_a_whole_key_given_for_its_id_revokes_it_and_is_never_echoed(tmp_path):
    """QA: `relay key revoke --org default relay_<id>_<secret>` said "no key
    'relay_<id>_<secret>'": the secret, into scrollback and CI logs. A whole key whose secret
    is the organisation's key's is revoked by it now; any other is refused naming the id to
    pass, and no error anywhere in the CLI prints a key's secret."""
    db = str(tmp_path / "relay.db")
    assert relay(tmp_path, "org", "create", "acme", "--db", db).returncode == 0
    other = json.loads(relay(tmp_path, "org", "create", "globex", "--db", db, "--json").stdout)
    made = relay(tmp_path, "key", "create", "--org", "acme", "--name", "ci", "--db", db)
    whole = re.search(r"relay_\S+", made.stdout).group(0)
    key_id, secret = whole.removeprefix("relay_").split("_", 1)
    theirs = other["admin_key"]

    def run(*args: str):
        done = relay(tmp_path, *args, "--db", db)
        for shown in (secret, theirs.split("_", 2)[2], secret[:-1]):
            assert shown not in done.stdout + done.stderr, done
        return done

    typo = run("key", "revoke", "--org", "acme", whole[:-1] + ("B" if whole[-1] == "A" else "A"))
    assert (typo.returncode, typo.stderr) == (
        4,
        f"relay: error: that is a whole key, not a key id, and its secret is not key {key_id}'s; "
        f"to revoke key {key_id}, pass its id: relay key revoke --org acme {key_id}\n",
    )
    elsewhere = run("key", "revoke", "--org", "acme", theirs)  # the right secret, another org's
    assert elsewhere.returncode == 4 and "this organisation holds no key" in elsewhere.stderr
    listed = run("key", "list", "--org", whole)
    assert listed.stderr == (
        f"relay: error: no organisation 'relay_{key_id}_<secret withheld>' (see 'relay org list')\n"
    )
    assert "active" in run("key", "list", "--org", "acme").stdout  # nothing revoked so far
    assert "active" in run("key", "list", "--org", "globex").stdout

    done = run("key", "revoke", "--org", "acme", whole.removeprefix("relay_"))
    assert (done.returncode, done.stdout) == (0, f"revoked {key_id} (named by its whole key)\n")
    again = run("key", "revoke", "--org", "acme", whole)
    assert again.returncode == 0
    assert again.stdout.startswith(f"{key_id} (named by its whole key) was already revoked, at ")
    row = next(r for r in run("key", "list", "--org", "acme").stdout.splitlines() if key_id in r)
    assert row.split("\t")[1] == "revoked"


def test_a_usage_error_quoting_a_whole_key_withholds_its_secret(tmp_path):
    """A key pasted as an extra argument is echoed by click's own usage error."""
    whole = "relay_0123456789ab_GJJ6abcdefghijklmnopqrstuvwxyz01"
    done = relay(tmp_path, "search", "which cluster", whole, "--url", "http://127.0.0.1:9")
    assert done.returncode == 2 and "GJJ6" not in done.stderr, done.stderr
    assert "relay_0123456789ab_<secret withheld>)" in done.stderr


def test_the_key_route_does_not_echo_a_whole_key_in_place_of_its_id(live_server):
    """DELETE /v1/keys/{id} with a whole key 404ed quoting it, secret and all."""
    minted = mint(live_server.url, live_server.admin_key, "echo-check", ["memory:read"])
    response = httpx.delete(
        f"{live_server.url}/v1/keys/{minted['secret']}",
        headers={"Authorization": f"Bearer {live_server.admin_key}"},
        timeout=30,
    )
    assert response.status_code == 404
    said = response.json()["error"]["message"]
    key_id, secret = minted["secret"].removeprefix("relay_").split("_", 1)
    assert secret not in said and said.endswith(f"its id, which this takes, is {key_id}"), said


def documented_first_org_commands() -> list[list[str]]:
    """The commands docs/deployment.md gives to make the first organisation before the
    service starts (its RELAY_DB export left to the caller)."""
    text = DEPLOYMENT.read_text()
    section = text.split("## The first organisation and its admin key", 1)[1]
    block = section.split("```\n", 2)[1]
    commands = [shlex.split(line, comments=True) for line in block.splitlines()]
    return [c for c in commands if c and c[0] == "relay"]


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_the_first_org_made_as_documented_keeps_serve_from_printing_a_key(tmp_path, request, kind):
    """QA: docs/deployment.md did not warn that `relay serve` on an empty database prints
    the first admin key on stdout, which a service's journal keeps for good. It does now,
    and the commands it gives instead work: then serve prints no key, and the one made
    before it serves."""
    if kind == "postgresql":
        db = request.getfixturevalue("pg_url")
        truncate_all(db)
    else:
        db = str(tmp_path / "srv" / "relay.db")
    commands = documented_first_org_commands()
    assert [c[:3] for c in commands] == [["relay", "org", "create"], ["relay", "key", "create"]]
    secrets = []
    for command in commands:
        done = relay(tmp_path, *command[1:], RELAY_DB=db)
        assert done.returncode == 0, done.stderr
        secrets += re.findall(r"relay_[0-9a-f]+_\S+", done.stdout)
    assert len(secrets) == 2
    server = start_server(db)  # type: ignore[arg-type]  (a URL where a path usually goes)
    try:
        assert "Created organisation" not in server.startup
        assert re.search(r"relay_[0-9a-f]+_", server.startup) is None, server.startup
        for secret in secrets:
            who = httpx.get(
                f"{server.url}/v1/whoami", headers={"Authorization": f"Bearer {secret}"}, timeout=30
            )
            assert who.status_code == 200 and who.json()["org"]["name"] == "acme", who.text
    finally:
        server.stop()
        if kind == "postgresql":
            truncate_all(db)
