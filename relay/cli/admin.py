"""`relay org` and `relay key`: administration on the database directly (`--db` / RELAY_DB)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import click

from relay.cli.common import (
    db_option,
    echo_json,
    open_store,
)
from relay.cli_types import StrictInt
from relay.errors import InvalidRequestError


@click.group()
def org() -> None:
    """Create and list organisations (on the database directly)."""


@org.command("create")
@click.argument("name")
@db_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def org_create(name: str, db: str | None, as_json: bool) -> None:
    """Create an organisation and its first admin key. NAME may not read as an
    organisation id (org_ and hex digits): --org takes either, and an id comes first."""
    from relay.auth import mint_key

    store = open_store(db, create=True)
    new = store.create_org(name)
    minted = mint_key(
        store, new.id, "admin", frozenset({"admin", "memory:read", "memory:write"}), frozenset()
    )
    if as_json:
        echo_json({"org": {"id": new.id, "name": new.name}, "admin_key": minted.secret})
    else:
        click.echo(f"organisation {new.name} ({new.id})\nadmin key (shown once): {minted.secret}")


@org.command("list")
@db_option
def org_list(db: str | None) -> None:
    """List organisations."""
    orgs = open_store(db).list_orgs()
    for o in orgs:
        click.echo(f"{o.id}\t{o.name}")
    if not orgs:
        click.echo(
            "no organisations yet (relay serve or relay org create makes the first)", err=True
        )


@click.group()
def key() -> None:
    """Create, list and revoke API keys (on the database directly)."""


def _org_id(store, name_or_id: str) -> str:  # noqa: ANN001
    found = store.find_org(name_or_id)
    if found is None:
        from relay.errors import NotFoundError

        raise NotFoundError(f"no organisation {name_or_id!r} (see 'relay org list')")
    return found.id


@key.command("create")
@click.option("--org", "org_name", required=True, help="Organisation name or id.")
@click.option("--name", required=True, help="What the key is for, e.g. 'alice laptop'.")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    default=("memory:read",),
    show_default=True,
    type=click.Choice(["memory:read", "memory:write", "admin"]),
    help="Repeatable.",
)
@click.option(
    "--role",
    "roles",
    multiple=True,
    help="Audience the key may read, named as memories' audiences are (lowercase letters, "
    "digits, _ . -; stored lower-cased); repeatable.",
)
@click.option(
    "--expires-in-days",
    type=StrictInt(1, 36500),
    help="Expire the key after N days (at most 100 years).",
)
@db_option
def key_create(
    org_name: str,
    name: str,
    scopes: tuple[str, ...],
    roles: tuple[str, ...],
    expires_in_days: int | None,
    db: str | None,
) -> None:
    """Create an API key; its secret is printed once."""
    from relay.auth import mint_key

    store = open_store(db)
    expires = datetime.now(UTC) + timedelta(days=expires_in_days) if expires_in_days else None
    minted = mint_key(
        store, _org_id(store, org_name), name, frozenset(scopes), frozenset(roles), expires
    )
    click.echo(
        f"key {minted.key.id} ({', '.join(sorted(scopes))}; roles: "
        f"{', '.join(sorted(minted.key.roles)) or 'none'})\nsecret (shown once): {minted.secret}"
    )


@key.command("list")
@click.option("--org", "org_name", required=True, help="Organisation name or id.")
@db_option
def key_list(org_name: str, db: str | None) -> None:
    """List an organisation's keys (never their secrets)."""
    store = open_store(db)
    keys = store.list_keys(_org_id(store, org_name))  # no header before 'no organisation'
    click.echo("id\tstate\tname\tscopes\troles\texpires")
    for k in keys:
        state = (
            "revoked"
            if k.revoked_at
            else "expired"
            if k.expires_at and k.expires_at < datetime.now(UTC)
            else "active"
        )
        expires = k.expires_at.isoformat(timespec="seconds") if k.expires_at else "never"
        roles = ",".join(sorted(k.roles)) or "-"
        click.echo(f"{k.id}\t{state}\t{k.name}\t{','.join(sorted(k.scopes))}\t{roles}\t{expires}")
        _warn_unaddressable_roles(k.id, k.roles)


def _warn_unaddressable_roles(key_id: str, roles: frozenset[str]) -> None:
    """Keys made before roles were held to the audience rule may hold one no memory can
    name ("Platform": audiences are lower-case); such a key reads what is for `all` alone."""
    from relay.hygiene import check_roles

    for role in sorted(roles):
        try:
            fixed = check_roles([role])
        except InvalidRequestError as exc:
            why = exc.message
        else:
            if fixed == {role}:
                continue
            meant = next(iter(fixed))
            why = f"role {role!r} is not lower-case, as audiences are; did you mean {meant!r}?"
        click.echo(
            f"warning: key {key_id} holds a role no memory can name, so it reads only what is for"
            f" all: {why} Create a key with the role you meant and revoke this one.",
            err=True,
        )


@key.command("revoke")
@click.option("--org", "org_name", required=True, help="Organisation name or id.")
@click.argument("key_id")
@db_option
def key_revoke(org_name: str, key_id: str, db: str | None) -> None:
    """Revoke a key at once, everywhere. KEY_ID is the id 'relay key list' shows. A whole
    key (relay_<id>_<secret>) pasted in its place is taken when it is one of the
    organisation's keys, and never printed; it stays in your shell history, harmless once
    revoked."""
    store = open_store(db)
    org_id = _org_id(store, org_name)
    given = key_id
    key_id = _named_key_id(store, org_id, org_name, given)
    before = next((k.revoked_at for k in store.list_keys(org_id) if k.id == key_id), None)
    store.revoke_key(org_id, key_id)  # refuses a key this org does not hold
    named = " (named by its whole key)" if key_id != given else ""
    if before is not None:  # judged by the row, not by a clock the database may not share
        when = before.isoformat(timespec="seconds")
        click.echo(f"{key_id}{named} was already revoked, at {when}")
    else:
        click.echo(f"revoked {key_id}{named}")


def _named_key_id(store, org_id: str, org_name: str, given: str) -> str:  # noqa: ANN001
    """The key id `given` names: itself, or the id within a whole key pasted in its place
    (`relay_<id>_<secret>`, its prefix maybe left off) once its secret proves it one of this
    organisation's keys. Its secret is never echoed: errors land in scrollback and CI logs."""
    import shlex

    from relay.auth import key_of
    from relay.errors import NotFoundError
    from relay.key_shape import PREFIX, split_key

    token = given if given.startswith(PREFIX) else PREFIX + given
    parts = split_key(token) if "_" in given else None  # a key id holds no "_"
    if parts is None:
        return given
    owned = key_of(store, token)
    if owned is not None and owned.org_id == org_id:
        return owned.id
    wanted = parts[0]
    if any(k.id == wanted for k in store.list_keys(org_id)):
        raise NotFoundError(
            f"that is a whole key, not a key id, and its secret is not key {wanted}'s; to "
            f"revoke key {wanted}, pass its id: relay key revoke --org {shlex.quote(org_name)} "
            f"{wanted}"
        )
    raise NotFoundError(
        f"that is a whole key, not a key id, and this organisation holds no key {wanted} "
        f"(its keys: relay key list --org {shlex.quote(org_name)})"
    )
