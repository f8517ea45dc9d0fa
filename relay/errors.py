"""Every error Relay raises on purpose, in one tree.

    RelayError                      500  internal
    ├── InvalidRequestError         400  invalid_request
    │   ├── SecretDetectedError     422  secret_detected
    │   └── TooLargeError           413  too_large
    ├── UnauthorizedError           401  unauthorized
    ├── ForbiddenError              403  forbidden
    ├── NotFoundError               404  not_found
    ├── RequestTimeoutError         408  request_timeout
    ├── ConflictError               409  conflict
    ├── OverloadedError             503  overloaded
    ├── UnavailableError            503  unavailable
    └── StoreError                  500  store_error

Each class carries its HTTP status, a stable machine-readable code and the CLI
exit code, so the API's error body and the CLI's one-line error come from the
same place. Foreign errors (sqlite3, psycopg, sockets) are translated once, at
the storage or transport edge, with `raise ... from exc`. A message that quotes
a database's own words is for the operator (the CLI, the server's log); a client
of the server is told the error's `public` sentence instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from logging import Logger


class RelayError(Exception):
    """Root of every Relay error."""

    status = 500
    code = "internal"
    exit_code = 1
    item: int | None = None  # set on a refusal of one item of a batch write: its place
    # What a client of the server is told in place of `message`, when that quotes another
    # system (a database's error text names its tables, hosts and ports): None, the message.
    public: str | None = None

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    @property
    def client_message(self) -> str:
        return self.public or self.message

    def log_if_withheld(self, log: Logger) -> None:
        """The operator's copy of an error a client is told only in general terms (API and
        MCP alike): a failed query with its traceback, a database that is away (every
        request says so) in a line."""
        if self.client_message == self.message:
            return
        if self.status >= 500 and self.code != "unavailable":
            log.error("%s: %s", self.code, self.message, exc_info=self)
        else:
            log.warning("%s: %s", self.code, self.message)

    def to_dict(self) -> dict[str, object]:
        body: dict[str, object] = {
            "code": self.code,
            "message": self.client_message,
            "status": self.status,
        }
        if self.details:
            body["details"] = self.details
        return {"error": body}


class InvalidRequestError(RelayError):
    """The request is malformed or a field fails validation."""

    status = 400
    code = "invalid_request"
    exit_code = 2


class SecretDetectedError(InvalidRequestError):
    """A memory body looks like it contains a credential; nothing was stored."""

    status = 422
    code = "secret_detected"


class TooLargeError(InvalidRequestError):
    """A body or field exceeds its size limit."""

    status = 413
    code = "too_large"


class UnauthorizedError(RelayError):
    """The API key is missing, unknown, revoked or expired."""

    status = 401
    code = "unauthorized"
    exit_code = 3


class ForbiddenError(RelayError):
    """The key is valid but lacks the scope for this action."""

    status = 403
    code = "forbidden"
    exit_code = 3


class NotFoundError(RelayError):
    """No such memory, key or organisation visible to this key."""

    status = 404
    code = "not_found"
    exit_code = 4


class RequestTimeoutError(RelayError):
    """The request's body did not arrive in time (a stalled or trickling client)."""

    status = 408
    code = "request_timeout"
    exit_code = 8  # as `unavailable`: the network between client and server failed it


class ConflictError(RelayError):
    """The write lost a race (a stale `expected_revision`), names an id already taken, or
    would revoke an organisation's last live admin key."""

    status = 409
    code = "conflict"
    exit_code = 5


class OverloadedError(RelayError):
    """The server is shedding load; retry after the given delay."""

    status = 503
    code = "overloaded"
    exit_code = 6


class UnavailableError(RelayError):
    """Something Relay needs (its database, or the server itself) cannot be reached right now."""

    status = 503
    code = "unavailable"
    exit_code = 8


# A search answer with no stage run and nothing found, `degraded` (relay.hook.pack.starved):
# the server had no time to search at all, which says nothing of what is recorded. MCP and
# `relay search` raise it as an UnavailableError, never "nothing relevant".
SEARCH_OUT_OF_TIME = (
    "the Relay server ran out of time before it could search, so nothing was searched"
    " (it may be busy)"
)


class StoreError(RelayError):
    """The database refused or failed a query (not a lost connection: see UnavailableError)."""

    status = 500
    code = "store_error"
    exit_code = 7
    public = "the database failed this request; the server's log has the details"
