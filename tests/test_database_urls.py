"""Database URLs through the real CLI: other schemes refused in one line (never taken for a
file name), a password never printed, and a clear line when PostgreSQL support is missing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import start_server
from integration_support import relay
from postgres_support import truncate_all

from relay.store.sqlite import SQLiteStore

NO_POSTGRES = (
    "relay: error: PostgreSQL support is not installed: pip install 'relay-memory[postgres]'"
)


def one_line_error(done) -> str:  # noqa: ANN001
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize(
    "url", ["postgresql+psycopg://relay:S3cretPw@127.0.0.1:1/relay", "mysql://u:S3cretPw@h/db"]
)
def test_other_schemes_are_refused_and_create_nothing(tmp_path: Path, url: str):
    work = tmp_path / "cwd"
    work.mkdir()
    for args, env in ((["org", "list", "--db", url], {}), (["serve"], {"RELAY_DB": url})):
        done = relay(tmp_path, *args, cwd=work, **env)
        line = one_line_error(done)
        assert line.startswith("relay: error: unsupported database URL "), line
        assert "S3cretPw" not in done.stdout + done.stderr
    assert list(work.iterdir()) == []


def test_a_mistyped_path_is_refused_by_reading_commands_and_creates_nothing(tmp_path: Path):
    """QA: `relay key list --db typo.db` left an empty database (and its folders) behind and
    said there was no organisation; `relay org list` printed nothing and exited 0."""
    missing = tmp_path / "typo" / "relay.db"
    for args in (["org", "list"], ["key", "list", "--org", "default"]):
        done = relay(tmp_path, *args, "--db", str(missing))
        assert one_line_error(done).startswith(f"relay: error: no Relay database at {missing}")
    assert not (tmp_path / "typo").exists()


def test_a_file_that_is_no_relay_store_is_refused_and_left_as_it_was(tmp_path: Path):
    """QA (second pass): `relay org list --db other.db` wrote Relay's tables into another
    program's SQLite file (and into an empty file), printed nothing and exited 0. QA (ops):
    `relay serve` still did, and made an organisation and an admin key in it."""
    import sqlite3

    from conftest import free_port

    other, empty = tmp_path / "other.db", tmp_path / "empty.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    empty.write_bytes(b"")
    before = {p: p.read_bytes() for p in (other, empty)}
    port = str(free_port())
    for db in (other, empty):
        for args in (["org", "list"], ["org", "create", "acme"], ["serve", "--port", port]):
            done = relay(tmp_path, *args, "--db", str(db))
            assert "is not a Relay SQLite store" in one_line_error(done)
    assert {p: p.read_bytes() for p in (other, empty)} == before
    done = relay(tmp_path, "org", "list", "--db", "postgresql:u:S3cretPw@h/db")
    assert "the // is missing" in one_line_error(done) and "S3cretPw" not in done.stderr


def test_sqlite_paths_and_urls_still_work(tmp_path: Path):
    for db in (tmp_path / "plain.db", f"sqlite:///{tmp_path}/url.db"):
        done = relay(tmp_path, "org", "create", "acme", "--db", str(db))
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "plain.db").exists() and (tmp_path / "url.db").exists()


def test_a_new_database_is_its_owners_alone_and_serve_warns_about_a_shared_one(tmp_path: Path):
    """QA: under the usual umask 022 the server's database (every audience's memories and
    the key hashes) was created readable by every user of the machine."""
    old = os.umask(0o022)
    try:
        done = relay(tmp_path, "org", "create", "acme", "--db", str(tmp_path / "new" / "r.db"))
    finally:
        os.umask(old)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "new" / "r.db").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "new" / "r.db"
    shared.chmod(0o644)  # as a database made before this fix was
    server = start_server(shared)
    try:
        assert "is readable by other users of this machine (mode 644)" in server.startup
        assert f"chmod 600 {shared}*" in server.startup
    finally:
        server.stop()


def test_serve_never_prints_the_password(tmp_path: Path, pg_url: str):
    truncate_all(pg_url)  # an empty database: serve creates the first org and says where
    url = pg_url.replace("postgres:@", "postgres:S3cretPw@", 1)  # local trust: ignored
    assert url != pg_url
    server = start_server(url)  # type: ignore[arg-type]  (a URL where a path usually goes)
    try:
        assert "Created organisation" in server.startup
        assert "serving postgresql://postgres:***@" in server.startup
        assert "S3cretPw" not in server.startup
    finally:
        server.stop()
        truncate_all(pg_url)


def test_missing_postgres_support_is_one_clear_line(tmp_path: Path, pg_url: str):
    hide = tmp_path / "no-psycopg"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['psycopg'] = None\n")
    path = os.pathsep.join(filter(None, [str(hide), os.environ.get("PYTHONPATH")]))
    source = tmp_path / "src.db"
    assert relay(tmp_path, "org", "create", "acme", "--db", str(source)).returncode == 0
    runs = [
        ["org", "list", "--db", pg_url],
        ["key", "list", "--org", "acme", "--db", pg_url],
        ["migrate", "--from", str(source), "--to", pg_url],
    ]
    for args in runs:
        done = relay(tmp_path, *args, PYTHONPATH=path)
        assert one_line_error(done) == NO_POSTGRES, args
    done = relay(tmp_path, "serve", PYTHONPATH=path, RELAY_DB=pg_url)
    assert one_line_error(done) == NO_POSTGRES


def test_an_unreachable_database_is_said_on_one_readable_line(tmp_path: Path):
    """QA: libpq's hint came through as a literal `\\n\\t` ("Connection refused\\n\\tIs the
    server running..."), the CLI escaping the line break it kept in its text."""
    import socket

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    for args in (["serve", "--port", "8964"], ["org", "list"]):
        done = relay(tmp_path, *args, "--db", f"postgresql://u:S3cretPw@127.0.0.1:{port}/relay")
        assert one_line_error(done) == (
            f"relay: error: database unreachable: connection refused at 127.0.0.1:{port} (is"
            " PostgreSQL running, and listening on that host and port?)"
        )
        assert done.returncode == 8 and "S3cretPw" not in done.stdout + done.stderr


@pytest.fixture(scope="module")
def password_login(pg_url: str) -> Iterator[str]:
    """A user of the test database who must give the password `RightPw1` (the test server
    trusts every other local login): a line of its own, first in pg_hba.conf."""
    import psycopg

    from relay.store.postgres import parse_url

    with psycopg.connect(parse_url(pg_url).conninfo, autocommit=True) as conn:
        hba = Path(conn.execute("SHOW hba_file").fetchone()[0])
        if not os.access(hba, os.W_OK):
            pytest.skip("the test database's pg_hba.conf cannot be edited here")
        before = hba.read_text()
        hba.write_text("local all relay_pw scram-sha-256\n" + before)
        conn.execute("SELECT pg_reload_conf()")
        conn.execute("CREATE ROLE relay_pw LOGIN PASSWORD 'RightPw1'")
        try:
            yield pg_url.replace("postgres:@", "relay_pw:RightPw1@", 1)
        finally:
            conn.execute("DROP ROLE relay_pw")
            hba.write_text(before)
            conn.execute("SELECT pg_reload_conf()")


def _said(monkeypatch, capsys, *args: str) -> tuple[int, str]:  # noqa: ANN001
    """`relay ARGS` run through its entry point in this process: (exit code, all it said)."""
    from relay.cli import main

    monkeypatch.setattr("sys.argv", ["relay", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    out = capsys.readouterr()
    return int(exit_.value.code or 0), out.out + out.err


def test_each_mistake_in_a_postgresql_url_is_named_and_never_its_password(
    tmp_path: Path, pg_url: str, password_login: str, monkeypatch, capsys
):
    """QA: a wrong password, a database or user that does not exist, an unknown option were
    each "database unreachable: connection failed: connection to server on socket ...
    failed: FATAL:  ..." (exit 8) or "database error: ..." (exit 7), whatever the cause; a
    mistyped scheme was refused without saying what it should be. `relay serve` reads the
    URL as these do (the test above runs it)."""
    from conftest import free_port

    source = tmp_path / "src.db"
    SQLiteStore(source).close()
    socket = f"at {pg_url.partition('host=')[2].partition('&')[0]}/.s.PGSQL.5432"
    right = password_login
    wrong = right.replace("RightPw1", "WrongPw9")
    port = free_port()
    cases = [
        (
            wrong,
            8,
            f"PostgreSQL {socket} refused the login: password authentication failed for user"
            ' "relay_pw" (check the user name and password in the URL)',
        ),
        (
            right.replace("/relay_test?", "/relay_no_such_db?"),
            8,
            f'PostgreSQL {socket} has no database "relay_no_such_db" (create it, or check the'
            " database name in the URL)",
        ),
        (
            wrong.replace("relay_pw:", "relay_no_such_user:"),
            8,
            f'PostgreSQL {socket} refused the login: there is no user "relay_no_such_user"'
            ' (role "relay_no_such_user" does not exist; check the URL\'s user name: without'
            " one, libpq takes your login name)",
        ),
        (
            right.replace(":RightPw1@", "@"),
            8,
            f"PostgreSQL {socket} asks for a password and the URL gives none"
            " (postgresql://USER:PASSWORD@HOST/DATABASE)",
        ),
        (
            "postgresql://relay_pw:WrongPw9@relay-no-such-host.invalid/relay",
            8,
            'database unreachable: cannot resolve host "relay-no-such-host.invalid" (check the'
            " URL's host)",
        ),
        (
            f"postgresql://relay_pw:WrongPw9@127.0.0.1:{port}/relay",
            8,
            f"database unreachable: connection refused at 127.0.0.1:{port} (is PostgreSQL"
            " running, and listening on that host and port?)",
        ),
        (wrong + "&bogus=1", 2, 'bad PostgreSQL URL: invalid URI query parameter: "bogus"'),
        (wrong + "&sslmode=bogus", 2, 'bad PostgreSQL URL: invalid sslmode value: "bogus"'),
        (
            wrong.replace("postgresql:", "postgresq:"),
            2,
            "unsupported database URL postgresq://...: did you mean postgresql://? use a"
            " SQLite file path, sqlite:///path or postgresql://...",
        ),
        (
            wrong.replace("postgresql:", "postgres+psycopg:"),
            2,
            "unsupported database URL postgres+psycopg://...: +psycopg names a driver, as"
            " SQLAlchemy's URLs do; Relay's is postgresql://; use a SQLite file path,"
            " sqlite:///path or postgresql://...",
        ),
    ]
    for url, code, line in cases:
        for args in (["org", "list", "--db", url], ["migrate", "--from", str(source), "--to", url]):
            said = _said(monkeypatch, capsys, *args)
            assert said == (code, f"relay: error: {line}\n"), args
            assert "WrongPw9" not in said[1] and "RightPw1" not in said[1]


def test_a_query_error_keeps_its_line_and_drops_the_caret():
    from relay.store.postgres.failures import driver_text

    said = 'syntax error at or near "SELEC"\nLINE 1: SELEC 1\n        ^\n'
    assert driver_text(Exception(said)) == 'syntax error at or near "SELEC"; LINE 1: SELEC 1'


def test_serve_on_a_port_in_use_is_one_line_and_creates_nothing(tmp_path: Path):
    """QA: `relay serve` on a taken port made the database, an organisation and its admin
    key, printed "serving", then failed in uvicorn's multi-line error (exit 3)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        db = tmp_path / "r.db"
        done = relay(tmp_path, "serve", "--db", str(db), RELAY_PORT=port)
    said = one_line_error(done)
    assert said == (
        f"relay: error: cannot listen on 127.0.0.1:{port}: Address already in use: is another"
        " server running? choose another port with --port or RELAY_PORT"
    )
    assert done.stdout == "" and not list(tmp_path.glob("r.db*"))


@pytest.mark.parametrize(
    ("flag", "value", "why"),
    [
        ("--port", "99999", "99999 is not in 1..65535"),
        ("--log-level", "loud", "'loud' is not one of debug, info, warning, error"),
        ("--max-inflight", "0", "0 is below 1"),
        ("--max-body-bytes", "-1", "-1 is below 1024"),
        ("--body-timeout", "0", "0 is not in 1..600"),
        ("--cache-entries", "-5", "-5 is below 0"),
        ("--embed-threads", "0", "0 is not in 1..64"),
        ("--embedder", "torch", "'torch' is not one of onnx, sentence-transformers"),
    ],
)
def test_serve_refuses_a_setting_out_of_range_before_anything(tmp_path: Path, flag, value, why):
    """QA: --port 99999 and --log-level loud ended in tracebacks; --max-inflight 0 started a
    server that answered every request 503, --max-body-bytes -1 one that took nothing."""
    db = tmp_path / "r.db"
    done = relay(tmp_path, "serve", "--db", str(db), flag, value)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert one_line_error(done) == (
        f"relay: error: Invalid value for '{flag}': {why} (see 'relay serve --help')"
    )
    variable = "RELAY_" + flag[2:].upper().replace("-", "_")
    done = relay(tmp_path, "serve", "--db", str(db), **{variable: value})
    name = flag[2:].replace("-", "_")
    assert one_line_error(done) == (
        f"relay: error: {variable}={value!r} is not a valid {name}: {why}"
    )
    assert not list(tmp_path.glob("r.db*"))


@pytest.mark.parametrize("value", ["80_80", "+8080", " 8080", "8080 ", "\u0668\u0660\u0668\u0660"])
def test_serve_reads_an_integer_setting_as_digits_alone(tmp_path: Path, value):
    """QA: `relay forget ID --expected-revision 1_0` sent revision 10 (Python's int() reads
    `1_0`, `+3`, ` 2`); `relay serve --port 80_80` listened on 8080 the same way. Its
    settings read integers as every integer option does, flag and variable alike."""
    db = tmp_path / "r.db"
    done = relay(tmp_path, "serve", "--db", str(db), "--port", value)
    assert one_line_error(done) == (
        f"relay: error: Invalid value for '--port': {value!r} is not a whole number"
        " (see 'relay serve --help')"
    )
    done = relay(tmp_path, "serve", "--db", str(db), RELAY_PORT=value)
    assert one_line_error(done) == (
        f"relay: error: RELAY_PORT={value!r} is not a valid port: {value!r} is not a whole number"
    )
    assert not list(tmp_path.glob("r.db*"))


@pytest.mark.parametrize("value", ["0_5", "+0.5", " 0.5", "0.5 ", "5e-1", "\u0660.\u0665", "nan"])
def test_serve_reads_a_decimal_setting_as_digits_and_a_point(tmp_path: Path, value):
    """`relay serve --threshold 0_5` (or RELAY_THRESHOLD=0_5) served at 0.5: the setting was
    read with float(), which also takes underscores, a sign, spaces around, an exponent and
    other scripts' digits, where every decimal option refuses them (relay.numerals)."""
    db = "mysql://u@h/db"  # refused later, were the value taken: no server starts either way
    done = relay(tmp_path, "serve", "--threshold", value, "--db", db)
    assert one_line_error(done) == (
        f"relay: error: Invalid value for '--threshold': {value!r} is not a decimal number"
        " (see 'relay serve --help')"
    )
    done = relay(tmp_path, "serve", "--db", db, RELAY_THRESHOLD=value)
    assert one_line_error(done) == (
        f"relay: error: RELAY_THRESHOLD={value!r} is not a valid threshold: {value!r} is not a"
        " decimal number"
    )


def test_a_usage_error_is_one_line_naming_the_help(tmp_path: Path):
    """QA: click's three lines (Usage / Try / Error), unlike every other error; and a port
    that is not a number was told in Python's words (invalid literal for int())."""
    # told before any server is asked for (none is set up here): a path not there, outside git
    done = relay(tmp_path, "import", str(tmp_path / "missing.md"))
    assert one_line_error(done) == (
        f"relay: error: no such file or folder: {tmp_path / 'missing.md'}"
        " (see 'relay import --help')"
    )
    assert done.returncode == 2
    done = relay(tmp_path, "serve", "--db", str(tmp_path / "r.db"), RELAY_PORT="abc")
    assert one_line_error(done) == (
        "relay: error: RELAY_PORT='abc' is not a valid port: 'abc' is not a whole number"
    )


@pytest.mark.parametrize("group", [(), ("key",), ("org",), ("skill",)])
def test_a_group_without_its_command_shows_its_help_as_help_does(tmp_path: Path, group):
    """QA: `relay` alone, the first thing a new user types, and `relay key` printed the whole
    help as one line of literal \\n after 'relay: error: Usage:'. Now the help --help
    prints, on stderr with exit 2 as click itself does for a group run bare."""
    done = relay(tmp_path, *group)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr == relay(tmp_path, *group, "--help").stdout
    assert "\\n" not in done.stderr and "relay: error" not in done.stderr


def test_serve_names_the_next_steps_of_the_readme(tmp_path: Path):
    """The first start's next step was to export RELAY_URL and RELAY_API_KEY, which `relay
    doctor` then warns about; it is the README's: install, remember, doctor, with the
    `relay` that was run."""
    server = start_server(tmp_path / "r.db")
    try:
        relay_bin = str(Path(server.process.args[0]))
        assert (
            f"{relay_bin} install --url {server.url} --key {server.admin_key}\n" in server.startup
        )
        assert f"{relay_bin} doctor\n" in server.startup
        assert "RELAY_API_KEY" not in server.startup
    finally:
        server.stop()


def test_serve_help_names_each_settings_type(tmp_path: Path):
    """Reviewer: seven settings showed their value as PARSE, the checking function's name."""
    shown = relay(tmp_path, "serve", "--help").stdout
    assert "PARSE" not in shown
    assert "--port INTEGER" in shown and "--log-level DEBUG|INFO|WARNING|ERROR" in shown


def test_every_option_read_from_the_environment_names_its_variable_in_help():
    """QA: `relay key create --help` gave --db's default as $RELAY_HOME/relay.db and `relay
    remember --help` --key's as "from relay install", while RELAY_DB and RELAY_API_KEY
    (README, docs/deployment.md) come first: a user with RELAY_DB exported was told another
    database."""
    import click

    from relay.cli import cli

    def options(command: click.Command, path: str):
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                yield from options(sub, f"{path} {name}")
        else:
            for param in command.params:
                if isinstance(param, click.Option) and param.envvar:
                    yield path, param

    found = list(options(cli, "relay"))
    assert {path for path, _ in found} >= {"relay org create", "relay key create", "relay search"}
    for path, option in found:
        assert f"default: {option.envvar}" in (option.help or ""), (path, option.opts)


def test_a_url_python_cannot_split_is_refused_in_one_line(tmp_path: Path):
    """QA: an unclosed IPv6 bracket ended `relay org list` and `relay serve` in a traceback
    (urllib's ValueError 'Invalid IPv6 URL') instead of Relay's one line."""
    url = "postgresql://relay:S3cretPw@[::1:5432/relay"
    for args, env in ((["org", "list", "--db", url], {}), (["serve"], {"RELAY_DB": url})):
        done = relay(tmp_path, *args, **env)
        assert one_line_error(done) == "relay: error: bad PostgreSQL URL: Invalid IPv6 URL"
        assert "S3cretPw" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    "password", ["S3cret%Passw0rd", "S3cret@Passw0rd", "S3cret?Passw0rd"], ids=["%", "@", "?"]
)
def test_a_password_left_unencoded_is_refused_without_quoting_it(tmp_path: Path, password):
    """QA: libpq's error quoted the password, whole (`invalid percent-encoded token:
    "S3cret%Passw0rd"`) or the part after the character (`failed to resolve host
    'Passw0rd@127.0.0.1'`), into the terminal, or the journal of a service."""
    url = f"postgresql://relay:{password}@127.0.0.1:5/relay"
    for args, env in ((["org", "list", "--db", url], {}), (["serve"], {"RELAY_DB": url})):
        done = relay(tmp_path, *args, **env)
        assert one_line_error(done) == (
            "relay: error: bad PostgreSQL URL: its user name or password holds a character"
            " that must be percent-encoded (@, :, /, #, ? or %: p@ss as p%40ss), so it splits"
            " elsewhere than meant"
        )
        assert "Passw0rd" not in done.stdout + done.stderr
