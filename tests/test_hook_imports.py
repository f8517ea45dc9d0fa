"""The hook's import graph is its latency: the hot path loads the standard library only."""

from __future__ import annotations

import subprocess
import sys

from hook_support import HOOK, FakeRelay, Hook, record, reply, results

HEAVY = {
    "click",
    "pydantic",
    "httpx",
    "fastapi",
    "starlette",
    "uvicorn",
    "numpy",
    "torch",
    "onnxruntime",
    "tokenizers",
    "sqlite3",
    "_sqlite3",
    "urllib",
    "http",
    "json",
    "re",
    "socket",
    "ssl",
    "threading",
    "hashlib",
    "tempfile",
    "pathlib",
    "datetime",
    "logging",
    "asyncio",
    "email",
    "typing",  # a few milliseconds on its own; type-only imports stay behind TYPE_CHECKING
}


def imported_modules(hook: Hook, stdin: bytes, *args: str) -> set[str]:
    """Every module the hook process imported, from `python -X importtime`."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", str(HOOK), *args],
        input=stdin,
        capture_output=True,
        env=hook.env,
        timeout=30,
    )
    assert proc.returncode == 0
    names = set()
    for line in proc.stderr.decode().splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":
                names.add(name)
    assert "relay.hook.run" in names, proc.stderr.decode()[-2000:]
    return names, proc.stdout


def heavy(names: set[str]) -> set[str]:
    return {
        n
        for n in names
        if n.split(".")[0] in HEAVY or n.startswith(("relay.server", "relay.store"))
    }


def test_hit_path_imports_nothing_heavy(tmp_path):
    with FakeRelay(reply(200, results(record("mem_1")))) as server:
        hook = Hook(tmp_path, server.url)
        names, out = imported_modules(hook, hook.payload("how do we run the database migrations?"))
    assert b"mem_1" in out  # the hit path really ran
    assert heavy(names) == set()
    relay_modules = {n for n in names if n.startswith("relay")}
    assert relay_modules <= {
        "relay",
        "relay.hook",
        "relay.hook.run",
        "relay.hook.breaker",
        "relay.hook.client",
        "relay.hook.codec",
        "relay.hook.config",
        "relay.hook.files",
        "relay.hook.gate",
        "relay.hook.outcome_log",
        "relay.hook.pack",
        "relay.hook.state",
        "relay.key_shape",
        "relay.numerals",
    }


def test_skip_and_session_start_paths_import_nothing_heavy(tmp_path):
    with FakeRelay(reply(200, results(record("mem_p", pinned=True)))) as server:
        hook = Hook(tmp_path, server.url)
        names, _ = imported_modules(hook, hook.payload("ok"))
        assert heavy(names) == set()
        names, out = imported_modules(hook, hook.start_payload("startup"), "session-start")
        assert b"mem_p" in out
        assert heavy(names) == set()


def test_malformed_stdin_path_imports_nothing_heavy(tmp_path):
    hook = Hook(tmp_path, "http://127.0.0.1:9")
    names, out = imported_modules(hook, b"\x00\xff not json")
    assert out == b""
    assert heavy(names) == set()


def test_https_imports_ssl_lazily(tmp_path):
    # A plain-HTTP fake answering an https URL: the handshake fails, the hook stays silent.
    with FakeRelay(reply(200, results())) as server:
        hook = Hook(tmp_path, server.url.replace("http://", "https://"), RELAY_DEADLINE_MS="1000")
        names, out = imported_modules(hook, hook.payload("how do we run the database migrations?"))
    assert out == b""
    assert "ssl" in names
    assert hook.last()["outcome"] in ("unavailable", "timeout")


def test_relay_package_is_import_free():
    code = (
        "import sys; seen = set(sys.modules); import relay; print(sorted(set(sys.modules) - seen))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "['relay']"


def test_the_rules_the_hook_shares_with_the_cli_and_server_are_import_free():
    """`relay.numerals` and `relay.key_shape` hold one rule each for the hook and for the
    CLI or the server (which import click, the store): on the hook's path, they import nothing."""
    code = (
        "import sys; import relay; seen = set(sys.modules); import relay.numerals, relay.key_shape;"
        " print(sorted(set(sys.modules) - seen))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "['relay.key_shape', 'relay.numerals']"


def test_https_hit_through_tls_with_a_trusted_certificate(tmp_path):
    import ssl

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True,
        capture_output=True,
    )
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    with FakeRelay(reply(200, results(record("mem_tls"))), tls=tls) as server:
        assert server.url.startswith("https://")
        hook = Hook(tmp_path, server.url, SSL_CERT_FILE=str(cert), SSL_CERT_DIR=str(tmp_path))
        names, out = imported_modules(hook, hook.payload("how do we run the database migrations?"))
        assert b"mem_tls" in out, hook.last()
        assert "ssl" in names
        # the same server is refused when its certificate is not trusted
        hook = Hook(tmp_path / "untrusted", server.url, SSL_CERT_DIR=str(tmp_path))
        run = hook.prompt("how do we run the database migrations?")
        assert run.out == b"" and hook.last()["outcome"] == "unavailable"
