"""`relay doctor`'s checks of the server and the key: that the configured URL is a Relay
server that answers in time, and that it takes the hook's key with the scopes recall needs.

`ServerChecks` is a part of `relay.doctor.Doctor`, kept apart to keep each module readable
in one sitting; it records its findings with the Doctor's `add`.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from relay.errors import RelayError, StoreError, UnavailableError
from relay.hook import config as hook_config

SLOW_SERVER_MS = 150
EXPIRY_WARNING = timedelta(days=7)


class ServerChecks:
    """The server part of the Doctor: /healthz, then /v1/whoami with the hook's key."""

    environ: dict[str, str]
    cfg: hook_config.Config | None
    url_source: str
    key_ok: bool | None

    if TYPE_CHECKING:

        def add(self, level: str, area: str, message: str, fix: str = "") -> None: ...
        def home(self, path: Path | str) -> str: ...
        def deadline_source(self) -> str: ...
        def _why_no_key(self, cfg: hook_config.Config) -> tuple[str, str]: ...

    def _client(self):  # noqa: ANN202
        from relay.client import RelayClient

        assert self.cfg is not None
        return RelayClient(self.cfg.url, self.cfg.api_key, timeout=5)

    def check_server(self) -> bool:
        client = self._client()
        times = []
        try:
            for _ in range(3):
                start = time.perf_counter()
                client.get("/healthz")
                times.append((time.perf_counter() - start) * 1000)
        except RelayError as exc:
            self.add("fail", "server", *self._server_failure(exc))
            return False
        best = min(times)
        level = "warn" if best > SLOW_SERVER_MS else "ok"
        assert self.cfg is not None  # check_config set it
        self.add(
            level,
            "server",
            f"{self.cfg.url} answers /healthz in {best:.0f} ms",
            f"the hook has {self.cfg.deadline_ms} ms for the whole prompt; put the server closer"
            f" or raise {self.deadline_source()}"
            if level == "warn"
            else "",
        )
        return True

    def _server_failure(self, exc: RelayError) -> tuple[str, str]:
        """What a failed /healthz means, and its fix: the server is away, or it answered
        that its own database is (a restart of the server would not help then), or what
        answers is not a Relay server (install's check)."""
        from relay.client import ConnectionFailedError

        assert self.cfg is not None
        if self.url_source == "RELAY_URL":
            where = "RELAY_URL (set in this shell; unset, the config file's url applies)"
        else:
            where = f"`url` in {self.home(hook_config.config_path(self.environ))}"
        if isinstance(exc, UnavailableError | StoreError) and not isinstance(
            exc, ConnectionFailedError
        ):
            return (
                f"the server at {self.cfg.url} answers, but its database is unreachable"
                f" ({exc.message}): every prompt goes without team memory",
                "check the server's database: is PostgreSQL up, and reachable from the server"
                " with its RELAY_DB?",
            )
        if isinstance(exc, ConnectionFailedError):
            return (
                f"{exc.message}: every prompt goes without team memory",
                f"start the server, or fix {where}"
                + ("" if self.url_source == "RELAY_URL" else " (`relay install --url ...`)"),
            )
        not_relay = self._not_relay()
        if not_relay:
            return (
                f"{not_relay}: every prompt goes without team memory",
                f"fix {where}"
                + ("" if self.url_source == "RELAY_URL" else " (`relay install --url ROOT`)"),
            )
        return (
            f"{self.cfg.url}/healthz failed: {exc.message}: every prompt goes without team memory",
            f"check the server's log, or fix {where}",
        )

    def _not_relay(self) -> str | None:
        """install's check that the URL is a Relay server's root (`relay install` says "not
        a Relay server root"), as the client decides it: GET /v1/whoami answers as Relay
        does. None when it does."""
        from relay.client import NotRelayRootError, whoami

        try:
            whoami(self._client())
        except NotRelayRootError as exc:
            return exc.message
        except RelayError:  # Relay's own error (a key refused): a Relay root
            return None
        return None

    def check_key(self) -> None:
        from relay.client import NotRelayRootError, whoami

        assert self.cfg is not None
        if not self.cfg.api_key:
            self.key_ok = False
            self.add("fail", "key", *self._why_no_key(self.cfg))
            return
        client = self._client()
        start = time.perf_counter()
        try:
            who = whoami(client)
        except NotRelayRootError as exc:  # /healthz looked like Relay's; /v1/whoami did not
            self.add("fail", "server", *self._server_failure(exc))
            return
        except RelayError as exc:
            self.key_ok = False
            self.add(
                "fail",
                "key",
                f"the server rejects the key: {exc.message}; recall is off on every prompt",
                "ask a Relay admin for a new key (`relay key create`), save it in a file, then "
                "`relay install --key-file FILE`",
            )
            return
        ms = (time.perf_counter() - start) * 1000
        key = who.get("key", {})
        scopes = key.get("scopes") or []
        roles = key.get("roles") or []
        if not set(scopes) & {"memory:read", "admin"}:
            self.key_ok = False
            self.add(
                "fail",
                "key",
                f"key {key.get('id')} lacks memory:read: every search is refused",
                "install a key with memory:read",
            )
            return
        self.key_ok = True
        self.add(
            "ok",
            "key",
            f"key {key.get('id')} of organisation {who.get('org', {}).get('name')}: scopes "
            f"{', '.join(scopes)}; roles {', '.join(roles) or 'none'} ({ms:.0f} ms)",
        )
        if "memory:write" not in scopes and "admin" not in scopes:
            self.add(
                "ok",
                "key",
                "read-only key: team_memory_remember and `relay remember` will be refused",
            )
        expires = key.get("expires_at")
        if expires:
            when = datetime.fromisoformat(expires.replace("Z", "+00:00"))
            if when - datetime.now(UTC) < EXPIRY_WARNING:
                self.add(
                    "warn",
                    "key",
                    f"the key expires at {expires}",
                    "get a new key, save it in a file and run `relay install --key-file FILE`"
                    " before then",
                )
