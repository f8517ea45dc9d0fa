"""`relay key` as a user types it, as a process on a real SQLite file, and the key routes of a
real server: a whole key typed where a key id goes is never printed back."""

from __future__ import annotations

import json
import re

import httpx
from integration_support import mint, relay


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
