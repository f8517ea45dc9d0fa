"""psycopg's errors in Relay's words, translated once, here (`translate_errors`).

A database that is away is `UnavailableError` (exit 8); a query it refused is `StoreError`
(exit 7); a URL option libpq cannot read (`?sslmode=bogus`) is a usage error (exit 2), as
every other mistake in the URL is. A connection that could not be made is named by its
cause: a wrong password, a user or database that does not exist, a host that does not
resolve, a port or socket nothing listens on, no answer in time. Each of those took a
reader through libpq's nested text ("database unreachable: connection failed: connection
to server on socket ... failed: FATAL:  password authentication failed ..."), labelled
unreachable whatever it said. libpq and PostgreSQL say these in English unless configured
otherwise; other words pass through on one line (`driver_text`). Neither ever quotes the
password.

psycopg and its pool log what they do about a broken connection ("discarding closed
connection", "error ignored terminating <psycopg.Pipeline [BAD]>") as warnings. A server
logs them; a command that configures no logging printed them through Python's last-resort
handler, beside its own one line, so the library's logger gets a handler that drops them
there (records still reach a configured root logger).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from relay.errors import InvalidRequestError, StoreError, UnavailableError

logging.getLogger("psycopg").addHandler(logging.NullHandler())

# SQLSTATEs that mean the connection, not the query, failed: class 08, and the server
# shutting down, crashing or still starting (57P01-03). Client-side errors have none.
_CONNECTION_STATES = ("08", "57P01", "57P02", "57P03")

# What a client is told while the database is away (the driver's words go to the log).
UNREACHABLE = "database unreachable: the server cannot reach its database right now"

# One failed attempt, as libpq words it: where, then why.
_ATTEMPT = re.compile(
    r'connection to server (?:at "(?P<host>[^"]*)"(?: \([^)]*\))?, port (?P<port>\d+)'
    r'|on socket "(?P<socket>[^"]*)") failed: (?:FATAL: +)?(?P<why>.*)'
)
# A cause libpq names -> what Relay says ({where}: the server tried; {0}: the name quoted).
_CAUSES = (
    (
        r'password authentication failed for user "([^"]*)"',
        'PostgreSQL {where} refused the login: password authentication failed for user "{0}"'
        " (check the user name and password in the URL)",
    ),
    (
        r'role "([^"]*)" does not exist',
        'PostgreSQL {where} refused the login: there is no user "{0}" (role "{0}" does not'
        " exist; check the URL's user name: without one, libpq takes your login name)",
    ),
    (
        r"no password supplied",
        "PostgreSQL {where} asks for a password and the URL gives none"
        " (postgresql://USER:PASSWORD@HOST/DATABASE)",
    ),
    (
        r"(no pg_hba\.conf entry for .*)",
        "PostgreSQL {where} refused the connection: {0} (its pg_hba.conf must allow it)",
    ),
    (
        r'database "([^"]*)" does not exist',
        'PostgreSQL {where} has no database "{0}" (create it, or check the database name in'
        " the URL)",
    ),
    (
        r"Connection refused",
        "database unreachable: connection refused {where} (is PostgreSQL running, and"
        " listening on that host and port?)",
    ),
    (
        r"No such file or directory",
        "database unreachable: no PostgreSQL socket {where} (is PostgreSQL running, with its"
        " socket in that folder, the URL's host?)",
    ),
)
# libpq's refusal of an option's value, before it connects.
_BAD_OPTION = re.compile(
    r'invalid (?:[\w ]+ value|port number|integer value "|URI query parameter|connection option)'
)
# A connection that went while in use: PostgreSQL stopped or restarted.
_CLOSED = ("server closed the connection unexpectedly", "the connection is lost")


def connection_lost(exc: psycopg.Error) -> bool:
    """Whether the database went away (down, restarting, unreachable, no free connection),
    as opposed to refusing one query: the first is worth retrying, the second is not."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    return exc.sqlstate is None or exc.sqlstate.startswith(_CONNECTION_STATES)


def driver_text(exc: BaseException) -> str:
    """psycopg's text on one line. libpq gives its hint a line of its own ("Connection
    refused\\n\\tIs the server running ...?"), each failed attempt another, a query error
    its LINE and caret: on the CLI's one-line error they showed as a literal `\\n\\t`."""
    out = ""
    for line in str(exc).split("\n"):
        line = line.strip()
        if not line or not line.strip("^"):  # blank, or the caret under a query's LINE
            continue
        out += line if not out else (" " if out[-1] in ".:;,?!" else "; ") + line
    return out


def unreachable_text(exc: psycopg.Error) -> str:
    """The line for a database that could not be reached or used, naming the cause where
    libpq's text says it, else libpq's text."""
    said = str(exc)
    if isinstance(exc, psycopg.errors.ConnectionTimeout):
        return (
            "database unreachable: no answer within the connect timeout (5 s, unless the URL's"
            " connect_timeout or PGCONNECT_TIMEOUT says otherwise)"
        )
    if host := re.match(r"failed to resolve host '([^']*)'", said):
        return f'database unreachable: cannot resolve host "{host[1]}" (check the URL\'s host)'
    attempts = list(_ATTEMPT.finditer(said))
    if len(attempts) == 1:  # several (a list of hosts, or of addresses): libpq's text says each
        where = _where(attempts[0])
        for pattern, sentence in _CAUSES:
            if found := re.search(pattern, attempts[0]["why"]):
                return sentence.format(*found.groups(), where=where)
    if any(words in said for words in _CLOSED) or (exc.sqlstate or "").startswith("57P0"):
        return (
            "database unreachable: PostgreSQL closed the connection while it was in use (it"
            " stopped or restarted, or ended this session)"
        )
    return f"database unreachable: {driver_text(exc)}"


def _where(attempt: re.Match[str]) -> str:
    if attempt["socket"]:
        return f"at {attempt['socket']}"
    return f"at {attempt['host']}:{attempt['port']}"


@contextmanager
def translate_errors() -> Iterator[None]:
    """psycopg's errors become Relay's, once, here. Their text (hosts, ports, tables) is for
    the operator: a client of the server is told the error's `public` sentence."""
    try:
        yield
    except psycopg.Error as exc:
        if exc.sqlstate is None and _BAD_OPTION.match(_bare(exc)):
            raise InvalidRequestError(f"bad PostgreSQL URL: {_bare(exc)}") from exc
        if connection_lost(exc):
            lost = UnavailableError(unreachable_text(exc))
            lost.public = UNREACHABLE
            raise lost from exc
        raise StoreError(f"database error: {driver_text(exc)}") from exc


def _bare(exc: psycopg.Error) -> str:
    """psycopg's text on one line, without its "connection is bad: " or "connection
    failed: " label."""
    return re.sub(r"^connection (?:is bad|failed): ", "", driver_text(exc))
