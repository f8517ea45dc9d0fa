"""A team's own server, which `relay eval replay` replays a JSONL of prompts against: the
checks before the replay (the server and key, the prompts' gold memories), a read key per
mode that searches, and their revocation after."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import click

from relay.errors import InvalidRequestError, RelayError

if TYPE_CHECKING:
    from pathlib import Path

    from relay.client import RelayClient
    from relay.eval.conversations import Conversation


def server(url: str | None, key: str | None) -> RelayClient:
    """The server and key a team's prompts replay against: the flags, else RELAY_URL and
    RELAY_API_KEY(_FILE), else the config `relay install` wrote, as every client command
    resolves them (`RelayClient.from_config`)."""
    from relay.client import RelayClient

    return RelayClient.from_config(url, key).require_key()


def check_server(client: RelayClient) -> dict[str, Any]:
    """One request before the replay (`GET /v1/whoami`): the server answers, takes the key,
    and the key may read. Otherwise every hook run would quietly log the failure and the
    report would measure a server that is down, or a key that is refused."""
    import shlex

    from relay.client import RelayClient, whoami
    from relay.errors import ForbiddenError, UnauthorizedError

    if not client.url.startswith(("http://", "https://")):
        raise InvalidRequestError(
            f"server URL must start with http:// or https:// (got {client.url!r})"
        )
    try:
        who = whoami(RelayClient(client.url, client.api_key, timeout=10))  # install's check
    except UnauthorizedError as exc:
        raise UnauthorizedError(f"{client.url} refused the key: {exc.message}") from None
    key = (who or {}).get("key") or {}
    if not set(key.get("scopes") or ()) & {"memory:read", "admin"}:
        org = ((who or {}).get("org") or {}).get("name") or "ORG"
        raise ForbiddenError(
            f"the key {key.get('id')} lacks memory:read, so every recall would be refused; "
            "an admin creates one where the server's database is with 'relay key create "
            f"--org {shlex.quote(org)} --name relay-eval --scope memory:read'"
        )
    return who or {}


SEARCHING = ("on", "ungated", "probe")  # `off` never asks the server: it reads with on's key


def mode_keys(client: RelayClient, who: dict[str, Any], more: tuple[str, ...]) -> dict[str, str]:
    """A read key per mode that searches, so no mode is served answers the server cached for
    another (its cache is per key): the keys given (--key once per mode, the first checked
    already), else ones minted with an admin key for this replay (`revoke` after). The probe's
    key also serves the warm-up."""
    from relay.client import RelayClient, whoami
    from relay.eval.harness import api

    org = who.get("org") or {}
    mine = who.get("key") or {}
    if more:
        given = (client.api_key, *more)
        if len(given) != len(SEARCHING) or len(set(given)) != len(given):
            raise InvalidRequestError(
                f"--key: give {len(SEARCHING)} different keys, one for each mode that searches "
                f"({', '.join(SEARCHING)}), or one admin key"
            )
        for secret in more:
            other = whoami(RelayClient(client.url, secret, timeout=10))
            key = other.get("key") or {}
            if (other.get("org") or {}).get("id") != org.get("id") or key.get("roles") != mine.get(
                "roles"
            ):
                raise InvalidRequestError(
                    f"--key: the key {key.get('id')} is not of the first key's organisation "
                    "and roles, so its mode would read other memories"
                )
            if not set(key.get("scopes") or ()) & {"memory:read", "admin"}:
                raise InvalidRequestError(f"--key: the key {key.get('id')} lacks memory:read")
        return {**dict(zip(SEARCHING, given, strict=True)), "off": given[0]}
    if "admin" not in (mine.get("scopes") or ()):
        raise InvalidRequestError(
            "the server caches answers per key, so one key would serve each mode the answers "
            f"of another: pass --key {len(SEARCHING)} times (memory:read keys of "
            f"{org.get('name') or 'the organisation'}, one each for {', '.join(SEARCHING)}), "
            "or an admin key, from which the replay mints them and revokes them after"
        )
    until = (datetime.now(UTC) + timedelta(days=1)).isoformat(timespec="seconds")
    out: dict[str, str] = {"_minted": ""}
    try:
        for mode in SEARCHING:
            body = {
                "name": f"relay-eval-{mode}",
                "scopes": ["memory:read"],
                "roles": mine.get("roles") or [],  # the admin key's view, no wider
                "expires_at": until,  # should the revocation after the replay never come
            }
            status, made = api(client.url, "POST", "/v1/keys", client.api_key, body)
            if status != 201 or not isinstance(made, dict):
                raise RelayError(f"{client.url}: minting a read key for the replay: HTTP {status}")
            out[mode] = made["secret"]
            out["_minted"] += f"{made['id']},"
    except BaseException:
        revoke(client, out)
        raise
    return {**out, "off": out["on"]}


def revoke(client: RelayClient, keys: dict[str, str]) -> None:
    """Revoke the keys `mode_keys` minted, naming those it could not (they expire in a
    day). Never raises: it runs in a `finally`, where it would hide the error on its way."""
    import http.client

    from relay.eval.harness import api

    left = []
    for key_id in filter(None, keys.get("_minted", "").split(",")):
        try:
            status, _ = api(client.url, "DELETE", f"/v1/keys/{key_id}", client.api_key)
        except (OSError, http.client.HTTPException) as exc:
            left.append(f"{key_id} ({type(exc).__name__})")
            continue
        if not 200 <= status < 300:
            left.append(f"{key_id} (HTTP {status})")
    if left:
        click.echo(
            f"relay: warning: could not revoke the keys this replay minted: {', '.join(left)};"
            " they expire in a day",
            err=True,
        )


def check_gold(url: str, key: str, conversations: list[Conversation], source: Path) -> None:
    """Every memory a prompt names in 'relevant' is one recall can bring this key: a mistyped
    id, a deleted memory or one for other audiences (404), or one superseded or expired
    (recall never returns those) leaves its prompt never useful, and both the figures and
    the advice fitted to them would read that as recall missing it, without a word."""
    import http.client
    import urllib.parse

    from relay.eval.harness import api

    now = datetime.now(UTC)
    checked: set[str] = set()
    for conv in conversations:
        for turn in conv.turns:
            for gold in turn.relevant:
                if gold in checked:
                    continue
                checked.add(gold)
                path = f"/v1/memories/{urllib.parse.quote(gold, safe='')}"
                try:
                    status, memory = api(url, "GET", path, key)
                except (OSError, http.client.HTTPException) as exc:
                    raise RelayError(f"{url}: reading the gold memory {gold}: {exc}") from None
                why = _never_recalled(status, memory, now)
                if why:
                    raise InvalidRequestError(
                        f"{source}: the prompt {turn.prompt[:60]!r} names {gold} in 'relevant', "
                        f"{why}: it could never count as useful"
                    )


def _never_recalled(status: int, memory: Any, now: datetime) -> str | None:
    """Why recall can never bring this memory (GET /v1/memories/ID's answer), or None."""
    if status == 404:
        return "which is no memory this key can read (mistyped, deleted, or for other audiences)"
    if status != 200 or not isinstance(memory, dict):
        raise RelayError(f"reading a gold memory answered HTTP {status}")
    if memory.get("superseded_by"):
        return f"which {memory['superseded_by']} supersedes, so recall never returns it"
    until = memory.get("valid_until")
    try:
        end = datetime.fromisoformat(str(until)) if until else None
    except ValueError:
        end = None
    if end is not None and (end if end.tzinfo else end.replace(tzinfo=UTC)) <= now:
        return f"which expired at {until}, so recall never returns it"
    return None
