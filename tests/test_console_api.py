"""The console's JSON API in-process, on both stores: sessions, filters, diffs, isolation, health.

The browser-level tests are in test_console.py; these pin what the page relies on
without a browser, and run on PostgreSQL as well as SQLite.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from relay import models
from relay.api_requests import encode_cursor, encode_position
from relay.console.routes import COOKIE, csrf_token
from relay.store.listing import ListPosition


def sign_in(api, who: str) -> dict[str, str]:
    """Sign the test client in as `who`; returns the CSRF header for writes."""
    api.client.cookies.clear()
    r = api.client.post("/console/api/session", json={"key": api.keys[who]})
    assert r.status_code == 200, r.text
    assert r.json()["csrf_token"] == csrf_token(api.keys[who])
    return {"X-CSRF-Token": r.json()["csrf_token"]}


def test_filters_diff_and_isolation(api) -> None:
    csrf = sign_in(api, "acme_admin")
    c = api.client
    soon = (datetime.now(UTC) + timedelta(days=2)).isoformat()
    first = c.post(
        "/console/api/memories",
        json={
            "body": "Use the blue cluster for staging.",
            "source": "team/infra",
            "tags": ["k8s"],
            "audiences": ["sre"],  # an sre memory may only replace what reached sre alone
        },
        headers=csrf,
    ).json()
    second = c.post(
        "/console/api/memories",
        json={
            "body": "Staging moved to the teal cluster.",
            "audiences": ["sre"],
            "supersedes": [first["id"]],
            "valid_until": soon,
        },
        headers=csrf,
    ).json()
    edited = c.patch(
        f"/console/api/memories/{second['id']}",
        json={
            "body": "Staging moved to the teal cluster.\nAsk #sre for access.",
            "expected_revision": 1,
        },
        headers=csrf,
    )
    assert edited.status_code == 200 and edited.json()["revision"] == 2

    def listed(**query) -> list[str]:
        r = c.get("/console/api/memories", params=query)
        assert r.status_code == 200, r.text
        return [m["id"] for m in r.json()["items"]]

    assert listed() == [second["id"], first["id"]]  # newest change first
    assert listed(source_prefix="team/") == [first["id"]]
    assert listed(q="TEAL ask") == [second["id"]]  # every word, case-insensitively
    assert listed(q="teal", status="superseded") == []
    assert listed(status="superseded") == [first["id"]]
    assert listed(status="expiring") == [second["id"]]
    assert set(listed(audience="sre")) == {first["id"], second["id"]}
    assert listed(tag="k8s") == [first["id"]]
    assert set(listed(author=first["author"])) == {first["id"], second["id"]}
    assert c.get("/console/api/memories", params={"status": "nope"}).status_code == 400

    diff = c.get(f"/console/api/memories/{second['id']}/diff", params={"from": 1, "to": 2}).json()
    body = next(f for f in diff["fields"] if f["field"] == "body")
    assert body["changed"] and {"op": "+", "text": "Ask #sre for access."} in body["lines"]

    # A key without the sre role cannot see the sre memory; another org sees neither.
    sign_in(api, "acme_dev")
    assert c.get(f"/console/api/memories/{second['id']}").status_code == 404
    assert second["id"] not in listed()
    sign_in(api, "globex_dev")
    for path in (first["id"], f"{first['id']}/revisions", f"{first['id']}/diff?from=1&to=1"):
        r = c.get(f"/console/api/memories/{path}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert listed() == []


def test_a_withheld_revision_is_listed_but_not_compared(api) -> None:
    """The console reads history through the store as the API does: a revision written for
    audiences the key lacks is listed withheld, and comparing it is refused, not diffed."""
    h = api.headers("acme_sre")
    made = api.client.post("/v1/memories", json={"body": "Deploys use the train."}, headers=h)
    path = f"/v1/memories/{made.json()['id']}"
    for edit in (
        {"body": "Break-glass: envelope 7.", "audiences": ["sre"]},
        {"body": "Deploys use the train on Tuesdays.", "audiences": ["all"]},
    ):
        assert api.client.patch(path, json=edit, headers=h).status_code == 200
    memory_id = made.json()["id"]
    sign_in(api, "acme_dev")
    c = api.client
    items = c.get(f"/console/api/memories/{memory_id}/revisions").json()["items"]
    assert [(r["withheld"], r["body"]) for r in items] == [
        (False, "Deploys use the train."),
        (True, None),
        (False, "Deploys use the train on Tuesdays."),
    ]
    refused = c.get(f"/console/api/memories/{memory_id}/diff", params={"from": 2, "to": 3})
    assert refused.status_code == 400 and "withheld" in refused.json()["error"]["message"]
    assert "envelope" not in refused.text
    fine = c.get(f"/console/api/memories/{memory_id}/diff", params={"from": 1, "to": 3})
    assert fine.status_code == 200 and "envelope" not in fine.text


def test_session_cookie_csrf_and_scopes(api) -> None:
    c = api.client
    c.cookies.clear()
    assert c.get("/console/api/session").json()["error"]["code"] == "unauthorized"
    bad = c.post("/console/api/session", json={"key": "relay_abc_" + "x" * 20})
    assert bad.status_code == 401
    # QA: a blank key was told "malformed Authorization header", a header never sent
    for blank in ("  ", ""):
        empty = c.post("/console/api/session", json={"key": blank})
        assert empty.status_code == 400 and empty.json()["error"]["message"] == (
            "the API key is empty: paste a key (relay_<key id>_<secret>)"
        )
        assert COOKIE not in empty.headers.get("set-cookie", "")
    csrf = sign_in(api, "acme_reader")
    assert c.cookies.get(COOKIE) == api.keys["acme_reader"]
    write = c.post("/console/api/memories", json={"body": "A fact."}, headers=csrf)
    assert write.status_code == 403 and "memory:write" in write.json()["error"]["message"]
    assert c.get("/console/api/keys").status_code == 403
    health = c.get("/console/api/health").json()
    assert health["developers"] is None  # streaks name keys: admins only
    # Revoking the key signs its console session out at once.
    admin = {"Authorization": f"Bearer {api.keys['acme_admin']}"}
    key_id = api.keys["acme_reader"].split("_")[1]
    assert c.delete(f"/v1/keys/{key_id}", headers=admin).status_code == 200
    gone = c.get("/console/api/session")
    assert gone.status_code == 401 and "revoked" in gone.json()["error"]["message"]


def test_health_counts_recall_not_console_searches(api) -> None:
    csrf = sign_in(api, "acme_admin")
    c = api.client
    memory = c.post(
        "/console/api/memories", json={"body": "Deploy staging with make deploy."}, headers=csrf
    ).json()
    c.post("/console/api/memories", json={"body": "The wiki lives on Confluence."}, headers=csrf)
    c.post("/console/api/search", json={"query": "how to deploy staging"}, headers=csrf)
    c.post("/console/api/preview", json={"prompt": "how do we deploy staging?"}, headers=csrf)
    assert c.get("/console/api/health").json()["searches"]["total"]["searches"] == 0
    r = c.post(
        "/v1/search",
        json={"query": "how do we deploy staging?", "deadline_ms": 2000},
        headers=api.headers("acme_dev"),
    )
    assert memory["id"] in [h["id"] for h in r.json()["results"]]
    health = c.get("/console/api/health").json()
    assert health["searches"]["total"]["searches"] == 1
    assert health["searches"]["deadline_ms"] == 2000
    assert [m["id"] for m in health["most_recalled"]] == [memory["id"]]
    assert memory["id"] not in [m["id"] for m in health["never_recalled"]["items"]]
    assert health["never_recalled"]["total"] == 1
    # The other org's health saw none of it.
    sign_in(api, "globex_dev")
    other = c.get("/console/api/health").json()
    assert other["searches"]["total"]["searches"] == 0 and other["most_recalled"] == []


def test_a_corrupted_cursor_is_refused(api) -> None:
    """As on /v1/memories: a cursor the console did not hand out is not a fresh start."""
    csrf = sign_in(api, "acme_admin")
    for i in range(3):
        r = api.client.post("/console/api/memories", json={"body": f"note {i}"}, headers=csrf)
        assert r.status_code == 201, r.text
    first = api.client.get("/console/api/memories", params={"limit": 2}).json()
    r = api.client.get("/console/api/memories", params={"limit": 2, "cursor": "garbage"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", r.text
    nul = api.client.get("/console/api/memories", params={"limit": 2, "cursor": "a\x00b"})
    assert nul.status_code == 400, nul.text
    for forged in (  # their check is right: it has no secret
        encode_cursor("a\x00b"),
        encode_position(ListPosition(1.5, "a\x00b")),
        encode_position(ListPosition(math.inf, "m1")),
        encode_cursor(first["items"][-1]["id"]),  # an older server's, which listed by id
    ):
        nul = api.client.get("/console/api/memories", params={"limit": 2, "cursor": forged})
        assert nul.status_code == 400 and nul.json()["error"]["code"] == "invalid_request"
    rest = api.client.get(
        "/console/api/memories", params={"limit": 2, "cursor": first["next_cursor"]}
    ).json()
    assert len(rest["items"]) == 1 and rest["next_cursor"] is None


def test_a_nul_is_answered_alike_by_both_stores(api) -> None:
    """QA: on PostgreSQL the console's memory paths, filters and key revocation answered a
    NUL with a 500 store_error, where SQLite found nothing."""
    csrf = sign_in(api, "acme_admin")
    c = api.client
    for path in ("memories/a%00b", "memories/a%00b/revisions", "memories/a%00b/diff?from=1&to=2"):
        r = c.get(f"/console/api/{path}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
    for method in ("patch", "delete"):
        r = c.request(method, "/console/api/memories/a%00b", json={"title": "x"}, headers=csrf)
        assert r.status_code == 404, r.text
    assert c.delete("/console/api/keys/a%00b", headers=csrf).status_code == 404
    for name in ("source_prefix", "q", "tag", "audience", "author"):
        r = c.get("/console/api/memories", params={name: "a\x00b"})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["message"] == f"{name} must not contain control characters"


def test_console_keys_get_the_role_rule(api) -> None:
    """Keys made on the console are named and normalised like the API's."""
    csrf = sign_in(api, "acme_admin")
    body = {"name": "n", "scopes": ["memory:read"], "roles": ["Ops Team"]}
    r = api.client.post("/console/api/keys", json=body, headers=csrf)
    assert r.status_code == 400 and "did you mean 'ops-team'?" in r.json()["error"]["message"]
    body["roles"] = ["Platform"]
    r = api.client.post("/console/api/keys", json=body, headers=csrf)
    assert r.status_code == 201 and r.json()["roles"] == ["platform"], r.text


def test_an_over_long_query_is_too_large_as_on_the_api(api) -> None:
    csrf = sign_in(api, "acme_admin")
    r = api.client.post("/console/api/search", json={"query": "q" * 9000}, headers=csrf)
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large", r.text
    assert "the limit is 8,000" in r.json()["error"]["message"]


def test_an_expired_memory_is_edited_from_its_form_like_on_the_api(api) -> None:
    """The console's form sends every field back, its past valid_until too: that was judged
    as a new expiry ("not in the future"), so an expired memory's text could not be fixed
    there, while the API keeps an expiry left out. Sent back unchanged, it is kept."""
    import time

    csrf = sign_in(api, "acme_admin")
    soon = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    m = api.client.post(
        "/console/api/memories",
        json={"body": "The 4.1 freeze is on.", "valid_until": soon},
        headers=csrf,
    ).json()
    time.sleep(1.2)
    form = {k: m[k] for k in ("title", "source", "audiences", "tags", "supersedes", "pinned")}
    form.update(body="The 4.1 freeze was on.", valid_until=m["valid_until"])
    r = api.client.patch(f"/console/api/memories/{m['id']}", json=form, headers=csrf)
    assert r.status_code == 200, r.text
    assert r.json()["valid_until"] == m["valid_until"] and r.json()["revision"] == 2
    form["audiences"] = []  # the field emptied: refused, never widened to everyone
    r = api.client.patch(f"/console/api/memories/{m['id']}", json=form, headers=csrf)
    assert r.status_code == 400 and "at least one role" in r.json()["error"]["message"]


def test_the_preview_accepts_the_token_budgets_the_hook_does(api) -> None:
    """A budget the hook ignores (it could never carry a record) is refused by the preview
    too, and the page's form starts where the hook's range does."""
    from relay.hook import config as hook_config

    csrf = sign_in(api, "acme_admin")
    c = api.client
    floor = c.get("/console/api/session").json()["hook"]["max_tokens_min"]
    parse = next(p for name, _, p, _ in hook_config.SETTINGS if name == "max_tokens")
    assert parse(floor) == floor
    prompt = {"prompt": "how do we deploy staging?"}
    for budget, status in ((floor - 1, 422), (floor, 200)):
        r = c.post("/console/api/preview", json={**prompt, "max_tokens": budget}, headers=csrf)
        assert r.status_code == status, r.text


def test_a_key_that_only_writes_cannot_read_through_an_edit(api) -> None:
    """As on /v1 (QA): the console's edit answered a write-only key's empty PATCH with the
    whole memory; an edit needs memory:read as well."""
    from relay.auth import mint_key

    scopes = frozenset({"memory:write"})
    writer = mint_key(api.services.store, api.orgs["acme"], "w", scopes, frozenset({"dev"}))
    api.keys["acme_writer"] = writer.secret
    r = api.client.post(
        "/console/api/memories",
        json={"body": "The HSM is in rack 12.", "audiences": ["dev"]},
        headers=sign_in(api, "acme_dev"),
    )
    assert r.status_code == 201, r.text
    csrf = sign_in(api, "acme_writer")
    edit = api.client.patch(f"/console/api/memories/{r.json()['id']}", json={}, headers=csrf)
    assert edit.status_code == 403 and edit.json()["error"]["code"] == "forbidden", edit.text
    assert "rack 12" not in edit.text


def test_edits_at_the_same_time_each_keep_what_the_other_changed(api) -> None:
    """As on /v1 (QA): the console's edit saved a draft built from the revision it had read
    over whatever came in between, so two editors reverted each other's fields."""
    import threading

    csrf = sign_in(api, "acme_admin")
    r = api.client.post("/console/api/memories", json={"body": "note", "title": "t0"}, headers=csrf)
    assert r.status_code == 201, r.text
    path = f"/console/api/memories/{r.json()['id']}"
    runs = {"title": [{"title": f"t{n}"} for n in range(1, 21)]}
    runs["source"] = [{"source": f"s/{n}"} for n in range(1, 21)]
    statuses: list[int] = []

    def edit(name: str) -> None:
        for change in runs[name]:
            statuses.append(api.client.patch(path, json=change, headers=csrf).status_code)

    threads = [threading.Thread(target=edit, args=(name,)) for name in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert statuses == [200] * 40
    history = api.client.get(f"{path}/revisions").json()["items"]
    titles = [int(r["title"].removeprefix("t")) for r in history]
    sources = [int((r["source"] or "s/0").removeprefix("s/")) for r in history]
    assert titles == sorted(titles) and sources == sorted(sources), (titles, sources)
    final = api.client.get(path).json()
    assert (final["title"], final["source"], final["revision"]) == ("t20", "s/20", 41)


def test_a_developer_name_is_kept_per_key_so_one_key_cannot_speak_for_others(api) -> None:
    """QA: any key could report as any developer (a read-only key sent {"developer":
    "admin"} over the admin's own reports) and could push every other developer out of the
    view by sending a thousand names."""
    report = {"invocations": 5, "outcomes": {"hit": 2, "no_match": 3}}
    broken = {**report, "unauthorized_streak": {"length": 4, "since": None}}

    def send(who: str, developer: str, body: dict) -> None:
        r = api.client.post(
            "/v1/hook-outcomes", json={**body, "developer": developer}, headers=api.headers(who)
        )
        assert r.status_code == 202, r.text

    send("acme_admin", "alice@laptop", broken)
    send("acme_reader", "alice@laptop", report)  # another key, the same name: a row of its own
    for n in range(40):
        send("acme_reader", f"flood-{n}", report)
    sign_in(api, "acme_admin")
    rows = api.client.get("/console/api/health").json()["developers"]
    alices = {r["key_name"]: r for r in rows if r["developer"] == "alice@laptop"}
    assert alices["admin"]["broken"] == ["unauthorized"]  # not overwritten by the reader
    assert "reader" not in alices  # the reader's own alice aged out under its flood
    assert sum(r["key_name"] == "reader" for r in rows) == models.NAMES_PER_KEY


def test_a_secret_sent_as_the_developer_name_is_refused_and_not_kept(api) -> None:
    """QA: `{"developer": "ghp_..."}` was accepted (202), kept for good and listed on the
    console's health page to every admin, where a key's own name with a secret is refused."""
    token = "gh" + "p_" + "aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI3kM5"
    r = api.client.post(
        "/v1/hook-outcomes",
        json={"developer": f"ci {token}", "invocations": 1, "outcomes": {"hit": 1}},
        headers=api.headers("acme_reader"),
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "secret_detected", r.text
    assert token not in r.text
    sign_in(api, "acme_admin")
    assert token not in api.client.get("/console/api/health").text


def test_the_console_reads_integers_in_query_strings_strictly(api) -> None:
    """As the API does: `?from=1.0` compared revision 1 and `?limit=%202` listed 2."""
    csrf = sign_in(api, "acme_dev")
    c = api.client
    m = c.post("/console/api/memories", json={"body": "Use pnpm."}, headers=csrf).json()
    c.patch(f"/console/api/memories/{m['id']}", json={"body": "Use pnpm 9."}, headers=csrf)
    diff = f"/console/api/memories/{m['id']}/diff"
    for path, query, name in (
        (diff, {"from": "1.0", "to": "2"}, "from"),
        (diff, {"from": "1", "to": " 2"}, "to"),
        ("/console/api/memories", {"limit": "2.0"}, "limit"),
        ("/console/api/memories", {"expiring_days": "+7"}, "expiring_days"),
    ):
        r = c.get(path, params=query)
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert error["code"] == "invalid_request"
        assert error["message"].startswith(f"query.{name}: {query[name]!r} is not an integer")
    assert c.get(diff, params={"from": "1", "to": "2"}).status_code == 200


def test_comparing_revisions_shows_a_pin_or_unpin(api) -> None:
    """QA: a revision that only pinned the memory compared as "No field changed"."""
    csrf = sign_in(api, "acme_dev")
    c = api.client
    m = c.post("/console/api/memories", json={"body": "Use pnpm."}, headers=csrf).json()
    c.patch(f"/console/api/memories/{m['id']}", json={"pinned": True}, headers=csrf)
    diff = c.get(f"/console/api/memories/{m['id']}/diff", params={"from": 1, "to": 2}).json()
    assert [f["field"] for f in diff["fields"] if f["changed"]] == ["pinned"]
    pinned = next(f for f in diff["fields"] if f["field"] == "pinned")
    assert pinned["lines"] == [{"op": "-", "text": "no"}, {"op": "+", "text": "yes"}]


def test_an_edit_the_key_can_no_longer_read_says_so(api) -> None:
    """As the API does: a dev key's edit to audiences ["sre"] is saved, with a warning."""
    csrf = sign_in(api, "acme_dev")
    c = api.client
    m = c.post(
        "/console/api/memories", json={"body": "Use pnpm.", "audiences": ["dev"]}, headers=csrf
    ).json()
    assert "warnings" not in m
    r = c.patch(f"/console/api/memories/{m['id']}", json={"audiences": ["sre"]}, headers=csrf)
    assert r.status_code == 200, r.text
    assert r.json()["warnings"][0].startswith(f"this key cannot read memory {m['id']} now")
    assert c.get(f"/console/api/memories/{m['id']}").status_code == 404
