"""Isolation drill: a seeded random stream of operations checked against a reference model.

Several organisations, keys with different scopes and roles, memories with audiences,
revisions, expiries, pins, deletions, key revocations and key expiries, all through the
real app (result cache on and warm). Every search must return a subset of what the model
says the key may see, at the revision the model holds; every read, list, profile and
history must match the model exactly. A mismatch is a leak (or a loss) and is recorded.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROLES = ("dev", "sre", "sec")
EVERYONE = "all"
VOCAB = (
    "deploy migrate cluster staging billing ledger cache queue worker schema index rollout "
    "canary secretless token rotate backup restore latency budget alert pager runbook"
).split()
PROFILE_LIMIT = 20  # pinned memories /v1/profile returns at most
EXPIRY_MARGIN = 1.0  # seconds around a memory's or key's expiry where either answer is fine


@dataclass
class KeyModel:
    name: str
    org: str
    secret: str
    key_id: str
    scopes: frozenset[str]
    roles: frozenset[str]
    expires_at: float | None = None
    revoked: bool = False

    def state(self, now: float) -> str:
        """valid, invalid, or unsure (too close to its expiry to tell)."""
        if self.revoked:
            return "invalid"
        if self.expires_at is None:
            return "valid"
        if now < self.expires_at - EXPIRY_MARGIN:
            return "valid"
        if now > self.expires_at + EXPIRY_MARGIN:
            return "invalid"
        return "unsure"

    @property
    def audiences(self) -> frozenset[str]:
        return self.roles | {EVERYONE}

    def can(self, scope: str) -> bool:
        return scope in self.scopes or "admin" in self.scopes


@dataclass
class MemModel:
    org: str
    id: str
    token: str  # a word only this memory's current body carries
    revision: int
    body: str
    audiences: frozenset[str]
    valid_until: float | None
    pinned: bool
    deleted: bool = False
    # rev, action, body, audiences (a deletion's: the last live revision's)
    history: list[tuple[int, str, str | None, frozenset[str]]] = field(default_factory=list)

    def managed_by(self, key: KeyModel) -> bool:
        """Management reads (get, list, edit, delete): any expiry, audience or admin."""
        return not self.deleted and self.history_by(key)

    def history_by(self, key: KeyModel) -> bool:
        """May `key` list its revisions: as a management read, deleted or not (a tombstone
        keeps the audiences of the last live revision)."""
        if self.org != key.org:
            return False
        return "admin" in key.scopes or bool(self.audiences & key.audiences)

    def history_seen_by(self, key: KeyModel) -> list[tuple[int, str, str | None, bool]]:
        """(rev, action, body, withheld) as `key` lists them: a revision written for
        audiences it lacks is withheld, whatever the memory's audiences are now."""
        seen = []
        for rev, action, body, audiences in self.history:
            readable = "admin" in key.scopes or bool(audiences & key.audiences)
            seen.append((rev, action, body if readable else None, not readable))
        return seen

    def recall(self, key: KeyModel, now: float) -> str:
        """May `key` recall it at `now`: yes, no or unsure (near its expiry)."""
        if self.deleted or self.org != key.org or not (self.audiences & key.audiences):
            return "no"
        if self.valid_until is None or now < self.valid_until - EXPIRY_MARGIN:
            return "yes"
        if now > self.valid_until + EXPIRY_MARGIN:
            return "no"
        return "unsure"


class Drill:
    def __init__(self, client: Any, store: Any, rng: random.Random, orgs: int = 3) -> None:
        from relay.auth import mint_key

        self.client, self.rng = client, rng
        self.keys: list[KeyModel] = []
        self.mems: dict[tuple[str, str], MemModel] = {}
        self.counts: dict[str, int] = {}
        self.leaks: list[str] = []
        self.serial = 0
        every = frozenset({"memory:read", "memory:write"})
        for o in range(orgs):
            org = store.create_org(f"drill-org-{o}-{rng.randrange(10**6)}")
            kinds = [
                ("admin", frozenset({"admin"}), frozenset()),
                ("plain", every, frozenset()),
                ("reader", frozenset({"memory:read"}), frozenset({"dev"})),
                ("writer", frozenset({"memory:write"}), frozenset({"sre"})),
            ] + [(f"role-{r}", every, frozenset({r})) for r in ROLES]
            kinds.append(("dev+sre", every, frozenset({"dev", "sre"})))
            for name, scopes, roles in kinds:
                minted = mint_key(store, org.id, name, scopes, roles)
                self.keys.append(
                    KeyModel(name, org.id, minted.secret, minted.key.id, scopes, roles)
                )
        self.orgs = sorted({k.org for k in self.keys})

    # -- plumbing --------------------------------------------------------------------
    def call(self, key: KeyModel, method: str, path: str, body: Any = None):
        headers = {"Authorization": f"Bearer {key.secret}"}
        t0 = time.time()
        resp = self.client.request(method, path, json=body, headers=headers)
        t1 = time.time()
        data = resp.json() if resp.content else None
        return resp.status_code, data, t0, t1

    def leak(self, what: str) -> None:
        self.leaks.append(what)

    def count(self, op: str) -> None:
        self.counts[op] = self.counts.get(op, 0) + 1

    def auth_ok(self, key: KeyModel, status: int, t0: float, t1: float, op: str) -> bool | None:
        """True when the key was valid for the whole request, None when it may not have been.
        A 2xx from a key the model says is invalid is a leak."""
        states = {key.state(t0), key.state(t1)}
        if states == {"invalid"}:
            if status != 401:
                self.leak(
                    f"{op}: key {key.name} ({'revoked' if key.revoked else 'expired'}) got {status}"
                )
            return None
        if states != {"valid"}:
            if status == 401:
                return None
            return True
        if status == 401:
            self.leak(f"{op}: valid key {key.name} refused 401")
            return None
        return True

    def scoped(self, key: KeyModel, scope: str, status: int, op: str) -> bool:
        """False (after checking the 403) when the key lacks `scope`."""
        if key.can(scope):
            return True
        if status != 403:
            self.leak(f"{op} without {scope} by {key.name}: {status}")
        return False

    def audiences_known(
        self, org: str, audiences: frozenset[str], t0: float, t1: float
    ) -> bool | None:
        """Whether a write made between t0 and t1 may name `audiences`: everyone, and the
        roles of the org's live keys (neither revoked nor expired); None when that turns on
        a key too close to its expiry to tell."""
        sure, maybe = {EVERYONE}, {EVERYONE}
        for k in self.keys:
            if k.org != org:
                continue
            states = {k.state(t0), k.state(t1)}
            if states == {"valid"}:
                sure |= k.roles
            if states != {"invalid"}:
                maybe |= k.roles
        if audiences <= sure:
            return True
        return None if audiences <= maybe else False

    def pick_key(self, org: str | None = None) -> KeyModel:
        keys = [k for k in self.keys if org is None or k.org == org]
        return self.rng.choice(keys)

    def pick_mem(self, org: str | None = None) -> MemModel | None:
        mems = [m for m in self.mems.values() if org is None or m.org == org]
        return self.rng.choice(mems) if mems else None

    def new_body(self) -> tuple[str, str]:
        self.serial += 1
        token = f"zq{self.serial}x{self.rng.randrange(10**6)}"
        words = " ".join(self.rng.choice(VOCAB) for _ in range(self.rng.randint(4, 10)))
        return token, f"{words} {token} {self.rng.choice(VOCAB)}."

    # -- operations ------------------------------------------------------------------
    def op_create(self) -> None:
        key = self.pick_key()
        org = key.org
        # Sometimes reuse an id another organisation already has: ids are per organisation.
        others = [m.id for m in self.mems.values() if m.org != org]
        mine = {m.id for m in self.mems.values() if m.org == org}
        if others and self.rng.random() < 0.3:
            mem_id = self.rng.choice(others)
        else:
            mem_id = f"m{self.serial}-{self.rng.randrange(10**4)}"
        token, body = self.new_body()
        audiences = self.rng.choice(
            [[EVERYONE], [EVERYONE], ["dev"], ["sre"], ["sec"], ["dev", "sec"]]
        )
        valid_until = None
        if self.rng.random() < 0.12:
            valid_until = time.time() + self.rng.uniform(2, 20)
        pinned = self.rng.random() < 0.2
        payload: dict[str, Any] = {
            "id": mem_id,
            "body": body,
            "audiences": audiences,
            "pinned": pinned,
            "source": f"drill/{token}",
        }
        if valid_until:
            payload["valid_until"] = datetime.fromtimestamp(valid_until, UTC).isoformat()
        status, data, t0, t1 = self.call(key, "POST", "/v1/memories", payload)
        self.count("create")
        if not self.auth_ok(key, status, t0, t1, "create"):
            return
        if not key.can("memory:write"):
            if status != 403:
                self.leak(f"create without write scope by {key.name}: {status}")
            return
        known = self.audiences_known(org, frozenset(audiences), t0, t1)
        if known is False or (known is None and status == 400):
            if status != 400:
                self.leak(f"create for audiences {audiences} nobody holds: {status}")
            return
        if mem_id in mine:
            if status != 409:
                self.leak(f"create over an existing id {mem_id}: {status} {data}")
            return
        if status != 201:
            self.leak(f"create {mem_id} failed: {status} {data}")
            return
        if data.get("revision") != 1:
            self.leak(f"create {mem_id} revision {data.get('revision')}")
        m = MemModel(org, mem_id, token, 1, body, frozenset(audiences), valid_until, pinned)
        m.history.append((1, "create", body, m.audiences))
        self.mems[(org, mem_id)] = m

    def op_edit(self) -> None:
        m = self.pick_mem()
        if m is None:
            return
        key = self.pick_key(m.org if self.rng.random() < 0.85 else None)
        m = self.mems.get((key.org, m.id)) or MemModel(
            key.org, m.id, "", 0, "", frozenset(), None, False, deleted=True
        )
        token, body = self.new_body()
        payload: dict[str, Any] = {"body": body}
        new_aud = m.audiences
        if self.rng.random() < 0.3:
            new_aud = frozenset(self.rng.choice([[EVERYONE], ["dev"], ["sre"], ["sec"]]))
            payload["audiences"] = sorted(new_aud)
        stale = self.rng.random() < 0.15
        if self.rng.random() < 0.5 and m.revision >= 1:
            payload["expected_revision"] = (
                m.revision - 1 if stale and m.revision > 1 else m.revision
            )
        stale = stale and m.revision > 1 and "expected_revision" in payload
        status, data, t0, t1 = self.call(key, "PATCH", f"/v1/memories/{m.id}", payload)
        self.count("edit")
        if not self.auth_ok(key, status, t0, t1, "edit"):
            return
        if not (key.can("memory:write") and key.can("memory:read")):
            if status != 403:  # an edit reads what it keeps: it needs both
                self.leak(f"edit without write and read scopes by {key.name}: {status}")
            return
        if not m.managed_by(key):
            if status != 404:
                self.leak(f"edit of {m.org}/{m.id} by {key.name}@{key.org}: {status}")
            return
        # The memory's own audiences stay acceptable after their last key is gone.
        known = self.audiences_known(m.org, new_aud - m.audiences, t0, t1)
        if known is False or (known is None and status == 400):
            if status != 400:
                self.leak(f"edit to audiences {sorted(new_aud)} nobody holds: {status}")
            return
        if stale:
            if status != 409:
                self.leak(f"stale edit of {m.id} accepted: {status}")
            return
        if status != 200:
            self.leak(f"edit {m.id} by {key.name}: {status} {data}")
            return
        m.revision += 1
        m.body, m.token, m.audiences = body, token, new_aud
        m.history.append((m.revision, "edit", body, new_aud))
        if data.get("revision") != m.revision:
            self.leak(f"edit {m.id} answered revision {data.get('revision')}, model {m.revision}")

    def op_delete(self) -> None:
        m = self.pick_mem()
        if m is None:
            return
        key = self.pick_key(m.org if self.rng.random() < 0.85 else None)
        m = self.mems.get((key.org, m.id)) or MemModel(
            key.org, m.id, "", 0, "", frozenset(), None, False, deleted=True
        )
        status, data, t0, t1 = self.call(key, "DELETE", f"/v1/memories/{m.id}")
        self.count("delete")
        if not self.auth_ok(key, status, t0, t1, "delete"):
            return
        if not key.can("memory:write"):
            if status != 403:
                self.leak(f"delete without write scope: {status}")
            return
        if not m.managed_by(key):
            if status != 404:
                self.leak(f"delete of {m.org}/{m.id} by {key.name}@{key.org}: {status}")
            return
        if status != 204:
            self.leak(f"delete {m.id}: {status} {data}")
            return
        m.history = [(r, a, None, aud) for r, a, _, aud in m.history]
        m.revision += 1
        m.history.append((m.revision, "delete", None, m.audiences))
        m.deleted = True

    def op_get(self) -> None:
        m = self.pick_mem()
        if m is None:
            return
        key = self.pick_key(m.org if self.rng.random() < 0.7 else None)
        status, data, t0, t1 = self.call(key, "GET", f"/v1/memories/{m.id}")
        self.count("get")
        if not self.auth_ok(key, status, t0, t1, "get"):
            return
        if not self.scoped(key, "memory:read", status, "get"):
            return
        same_id = self.mems.get((key.org, m.id))
        target = same_id if same_id is not None else m
        if not target.managed_by(key):
            if status != 404:
                self.leak(f"get {m.id} by {key.name}@{key.org} (may not): {status} {data}")
            return
        if (
            status != 200
            or data.get("revision") != target.revision
            or data.get("body") != target.body
        ):
            self.leak(
                f"get {m.id} by {key.name}: {status} rev {data and data.get('revision')}, "
                f"model rev {target.revision}"
            )

    def op_history(self) -> None:
        m = self.pick_mem()
        if m is None:
            return
        key = self.pick_key(m.org if self.rng.random() < 0.7 else None)
        status, data, t0, t1 = self.call(key, "GET", f"/v1/memories/{m.id}/revisions")
        self.count("history")
        if not self.auth_ok(key, status, t0, t1, "history"):
            return
        if not self.scoped(key, "memory:read", status, "history"):
            return
        target = self.mems.get((key.org, m.id))
        if target is None or not target.history_by(key):
            if status != 404:
                self.leak(f"history {m.id} by {key.name}@{key.org} (may not): {status}")
            return
        got = [
            (r["revision"], r.get("action"), r.get("body"), r.get("withheld"))
            for r in (data or {}).get("items", [])
        ]
        want = target.history_seen_by(key)
        if status != 200 or got != want:
            self.leak(f"history {m.id} by {key.name}: {status} {got} != model {want}")

    def op_list(self) -> None:
        key = self.pick_key()
        status, data, t0, t1 = self.call(key, "GET", "/v1/memories?limit=500")
        self.count("list")
        if not self.auth_ok(key, status, t0, t1, "list"):
            return
        if not self.scoped(key, "memory:read", status, "list"):
            return
        want = sorted(m.id for m in self.mems.values() if m.managed_by(key))
        got = sorted(i["id"] for i in (data or {}).get("items", []))
        if status != 200 or got != want:
            self.leak(
                f"list by {key.name}: extra {set(got) - set(want)} missing {set(want) - set(got)}"
            )

    def op_profile(self) -> None:
        key = self.pick_key()
        status, data, t0, t1 = self.call(key, "GET", "/v1/profile")
        self.count("profile")
        if not self.auth_ok(key, status, t0, t1, "profile"):
            return
        if not self.scoped(key, "memory:read", status, "profile"):
            return
        sure = {
            m.id
            for m in self.mems.values()
            if m.pinned and m.recall(key, t0) == m.recall(key, t1) == "yes"
        }
        maybe = {
            m.id
            for m in self.mems.values()
            if m.pinned and "no" not in (m.recall(key, t0), m.recall(key, t1))
        }
        maybe |= {
            m.id for m in self.mems.values() if m.pinned and m.recall(key, t0) != m.recall(key, t1)
        }
        got = {r["id"] for r in (data or {}).get("results", [])}
        # The profile is the PROFILE_LIMIT most recently updated pins: all of them only below it.
        complete = len(got) < PROFILE_LIMIT
        if status != 200 or not got <= maybe or (complete and not sure <= got):
            self.leak(f"profile by {key.name}: extra {got - maybe} missing {sure - got}")

    def op_search(self) -> None:
        key = self.pick_key()
        roll = self.rng.random()
        own = [m for m in self.mems.values() if not m.deleted]
        if own and roll < 0.5:
            target = self.rng.choice(own)  # its token: found exactly when the key may see it
            query = target.token
        else:
            target = None
            query = " ".join(self.rng.sample(VOCAB, 3))  # shared words: candidates everywhere
        mode = self.rng.choice(["lexical", "lexical", "hybrid"])
        status, data, t0, t1 = self.call(
            key, "POST", "/v1/search", {"query": query, "k": 12, "mode": mode, "deadline_ms": 5000}
        )
        self.count("search")
        if not self.auth_ok(key, status, t0, t1, "search"):
            return
        if not key.can("memory:read"):
            if status != 403:
                self.leak(f"search without read scope by {key.name}: {status}")
            return
        if status != 200:
            self.leak(f"search by {key.name}: {status} {data}")
            return
        for r in data["results"]:
            m = self.mems.get((key.org, r["id"]))
            if (
                m is None
                or "no" in (m.recall(key, t0), m.recall(key, t1))
                and not (m.recall(key, t0) != m.recall(key, t1))
            ):
                self.leak(
                    f"search by {key.name}@{key.org} returned {r['id']} it may not see "
                    f"(cached={data.get('cached')})"
                )
                continue
            if r["revision"] != m.revision or r["text"] not in m.body:
                self.leak(
                    f"search returned {r['id']} rev {r['revision']}, model rev {m.revision} "
                    f"(cached={data.get('cached')})"
                )
        if target is not None and mode == "lexical":
            if target.org == key.org and target.recall(key, t0) == target.recall(key, t1) == "yes":
                if target.id not in {r["id"] for r in data["results"]}:
                    self.leak(f"lexical search for {target.token} by {key.name} missed {target.id}")

    def op_revoke(self) -> None:
        live = [k for k in self.keys if not k.revoked and k.name != "admin"]
        if len(live) <= len(self.orgs) * 5:
            return
        key = self.rng.choice(live)
        admin = next(k for k in self.keys if k.org == key.org and k.name == "admin")
        status, _, _, _ = self.call(admin, "DELETE", f"/v1/keys/{key.key_id}")
        self.count("revoke")
        if status != 200:
            self.leak(f"revoke {key.name}: {status}")
            return
        key.revoked = True

    def op_new_key(self) -> None:
        org = self.rng.choice(self.orgs)
        admin = next(k for k in self.keys if k.org == org and k.name == "admin")
        roles = sorted(self.rng.sample(ROLES, self.rng.randint(0, 2)))
        scopes = self.rng.choice([["memory:read"], ["memory:read", "memory:write"]])
        body: dict[str, Any] = {"name": f"k{self.serial}", "scopes": scopes, "roles": roles}
        expires = None
        if self.rng.random() < 0.4:
            expires = time.time() + self.rng.uniform(2, 15)
            body["expires_at"] = datetime.fromtimestamp(expires, UTC).isoformat()
        status, data, _, _ = self.call(admin, "POST", "/v1/keys", body)
        self.count("new_key")
        if status != 201:
            self.leak(f"new key: {status} {data}")
            return
        self.keys.append(
            KeyModel(
                body["name"],
                org,
                data["secret"],
                data["id"],
                frozenset(scopes),
                frozenset(roles),
                expires,
            )
        )

    def run(self, ops: int) -> None:
        table = [
            (self.op_create, 18),
            (self.op_edit, 10),
            (self.op_delete, 4),
            (self.op_get, 12),
            (self.op_history, 8),
            (self.op_list, 3),
            (self.op_profile, 4),
            (self.op_search, 38),
            (self.op_revoke, 1),
            (self.op_new_key, 2),
        ]
        funcs, weights = zip(*table, strict=True)
        for _ in range(ops):
            self.rng.choices(funcs, weights)[0]()


def run(
    ops: int, seed: int, db: str | None = None, embedder: Any = None, store: Any = None
) -> dict[str, Any]:
    """Run `ops` random operations; returns the figures (leaks listed, zero expected)."""
    import tempfile

    from starlette.testclient import TestClient

    from relay.cache import ResultCache
    from relay.embedding import load_embedder
    from relay.metrics import Metrics
    from relay.search import Searcher
    from relay.server import Services, asgi_app
    from relay.store import open_store

    tmp = tempfile.TemporaryDirectory(prefix="relay-drill-iso-")
    owned = store is None
    store = store or open_store(db or str(Path(tmp.name) / "relay.db"))
    embedder = embedder or load_embedder("onnx", 1)
    searcher = Searcher(store, embedder, cache=ResultCache())
    started = time.monotonic()
    try:
        with TestClient(
            asgi_app(Services(store, searcher, embedder, Metrics())), raise_server_exceptions=False
        ) as client:
            drill = Drill(client, store, random.Random(seed))
            drill.run(ops)
    finally:
        searcher.close()
        if owned:
            store.close()
        tmp.cleanup()
    return {
        "seed": seed,
        "ops": sum(drill.counts.values()),
        "by_op": dict(sorted(drill.counts.items())),
        "orgs": len(drill.orgs),
        "keys": len(drill.keys),
        "memories": len(drill.mems),
        "seconds": round(time.monotonic() - started, 1),
        "leaks": len(drill.leaks),
        "leak_examples": drill.leaks[:10],
    }
