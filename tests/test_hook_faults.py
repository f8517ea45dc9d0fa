"""Every fault ends with exit 0, nothing for the model, within the deadline (+50 ms is the target;
tests allow +150 ms because the test machine is shared)."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
from hook_support import (
    HOOK,
    FakeRelay,
    Hook,
    assert_hit_contract,
    assert_silent,
    free_port,
    record,
    reply,
    results,
)

DEADLINE = 400
SLACK = 150
# For a run judged on what the hook makes of its input, not on its deadline: under load the
# process can start so late that 400 ms leave nothing to search with ("no_budget_left").
ROOMY = 2000
PROMPT = "use the same database migration convention as last time for the orders table"


def hung(server):
    return lambda conn, request: server.wait(10)


def slow_body(server):
    def handle(conn, request):
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
        )
        for _ in range(100):
            conn.sendall(b" ")
            server.wait(0.1)

    return handle


def oversized(server):
    def handle(conn, request):
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 52428800\r\n\r\n"
        )
        try:
            while not server.stopping.is_set():
                conn.sendall(b'{"text": "' + b"x" * 60000 + b'"},')
        except OSError:
            pass

    return handle


def oversized_chunked(server):
    def handle(conn, request):
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            while not server.stopping.is_set():
                conn.sendall(b"ea60\r\n" + b"x" * 60000 + b"\r\n")
        except OSError:
            pass

    return handle


def truncated(server):
    def handle(conn, request):
        conn.sendall(
            b'HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{"results": [{"id": "m1", "text": "half'
        )
        server.wait(2)

    return handle


def closed_mid_body(server):
    def handle(conn, request):
        conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{"results": [')

    return handle


def garbage_status(server):
    return lambda conn, request: conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")


def fixed(status, body):
    return lambda server: reply(status, body)


# kind -> (handler factory, outcome in the log)
FAULTS = {
    "hung": (hung, "timeout"),
    "slow_body": (slow_body, "timeout"),
    "oversized": (oversized, "invalid_response"),
    "oversized_chunked": (oversized_chunked, "invalid_response"),
    "truncated_json": (truncated, "timeout"),
    "closed_mid_body": (closed_mid_body, "unavailable"),
    "invalid_json": (fixed(200, b"<html>definitely not json</html>"), "invalid_response"),
    "wrong_shape": (fixed(200, {"unexpected": [1, 2, 3], "results": "nope"}), "invalid_response"),
    "wrong_field_type": (
        fixed(200, results(record("m1"), {**record("m2"), "revision": "2"})),
        "invalid_response",
    ),
    "nan_score": (
        fixed(200, b'{"results": [{"id": "m", "revision": 1, "text": "t", "score": NaN}]}'),
        "invalid_response",
    ),
    "garbage_status_line": (garbage_status, "invalid_response"),
    "http_500": (fixed(500, {"error": "boom"}), "unavailable"),
    "http_503": (fixed(503, {"error": {"code": "overloaded"}}), "unavailable"),
    "http_404": (fixed(404, {"error": {"code": "not_found"}}), "invalid_response"),
    "http_401": (fixed(401, {"error": {"code": "unauthorized"}}), "unauthorized"),
    "http_403": (fixed(403, {"error": {"code": "forbidden"}}), "unauthorized"),
}


@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_fault_ends_silently_on_time(tmp_path, kind):
    factory, outcome = FAULTS[kind]
    # Only a fault that hangs needs the deadline to end it. One answered at once must end at
    # once, and be classified as itself: with DEADLINE, a hook started late under load never
    # sent its request and logged a timeout (`no_budget_left`, not `invalid_response`).
    deadline = DEADLINE if outcome == "timeout" else ROOMY
    server = FakeRelay()
    server.handler = factory(server)
    with server:
        hook = Hook(tmp_path, server.url, RELAY_DEADLINE_MS=str(deadline))
        for n in range(2):
            run = hook.prompt(PROMPT, session=f"s{n}")
            assert run.rc == 0
            assert run.ms <= DEADLINE + SLACK, run.ms
            if kind in ("http_401", "http_403"):
                # once per session, one line for the user and nothing for the model
                assert set(run.output) == {"systemMessage"}
                assert "Relay" in run.output["systemMessage"]
            else:
                assert_silent(run)
            assert hook.last()["outcome"] == outcome, hook.last()


@pytest.mark.parametrize("kind", ["refused", "unresolvable"])
def test_no_server_ends_silently_on_time(tmp_path, kind):
    # The port is picked as the test runs, not as it is collected: a test's name must not
    # change between two collections (pytest-xdist's workers compare theirs).
    url = {
        "refused": f"http://127.0.0.1:{free_port()}",
        "unresolvable": "http://relay.invalid:8080",
    }
    hook = Hook(tmp_path, url[kind], RELAY_DEADLINE_MS=str(DEADLINE))
    run = hook.prompt(PROMPT)
    assert_silent(run)
    assert run.ms <= DEADLINE + SLACK
    assert hook.last()["outcome"] in ("unavailable", "timeout")


def test_unauthorized_tells_the_user_once_per_session(tmp_path):
    with FakeRelay(reply(401, {"error": {"code": "unauthorized"}})) as server:
        hook = Hook(tmp_path, server.url, RELAY_THROTTLE_PROMPTS="0", RELAY_OVERLAP_THRESHOLD="1.5")
        first = hook.prompt(PROMPT)
        assert set(first.output) == {"systemMessage"}
        assert "\n" not in first.output["systemMessage"]
        for _ in range(3):
            assert_silent(hook.prompt(PROMPT))
            assert hook.last()["outcome"] == "unauthorized"
        assert set(hook.prompt(PROMPT, session="another").output) == {"systemMessage"}


def test_deadline_bounds_the_whole_process_and_is_sent_to_the_server(tmp_path):
    # 800 ms: CI once started the hook so slowly under load that a 250 ms deadline left it
    # under 20 ms for the server, so it rightly sent nothing ("no_budget_left"); 400 ms did
    # the same 2 times in 5 with three busy loops beside the suite.
    deadline = 800
    server = FakeRelay()
    server.handler = hung(server)
    with server:
        hook = Hook(tmp_path, server.url, RELAY_DEADLINE_MS=str(deadline))
        run = hook.prompt(PROMPT)
        entry = hook.last()
        assert entry.get("reason") != "no_budget_left", entry
        # The hook has given up; the server's thread may still be reading what it sent.
        (req,) = server.wait_for_requests(1)
    assert_silent(run)
    assert run.ms <= deadline + SLACK
    assert 20 <= req.json()["deadline_ms"] <= deadline - 50
    assert entry["outcome"] == "timeout"
    assert entry["ms"]["total"] <= deadline


def test_a_late_answer_is_never_injected(tmp_path):
    # The answer comes 100 ms after the budget the hook gave the server (its deadline ends 50 ms
    # after that): late, whatever the hook's start left of its deadline. At 300 ms, with a fixed
    # 350 ms answer, a hook started late under load sent nothing (`no_budget_left`): the test
    # checked nothing, or failed reading a session state never written.
    def late(conn, request):
        server.wait(request.json()["deadline_ms"] / 1000 + 0.1)
        reply(200, results(record("mem_late")))(conn, request)

    server = FakeRelay(late)
    with server:
        hook = Hook(tmp_path, server.url, RELAY_DEADLINE_MS=str(2 * DEADLINE))
        assert_silent(hook.prompt(PROMPT))
    assert (hook.last()["outcome"], hook.last().get("reason")) == ("timeout", "network")
    assert "mem_late" not in json.dumps(hook.session_state())


def test_chunked_response_is_read(tmp_path):
    body = json.dumps(results(record("mem_chunked"))).encode()

    def chunked(conn, request):
        parts = [body[i : i + 7] for i in range(0, len(body), 7)]
        payload = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + payload)

    with FakeRelay(chunked) as server:
        hook = Hook(tmp_path, server.url)
        assert "mem_chunked" in assert_hit_contract(hook.prompt(PROMPT))


MALFORMED_STDIN = {
    "not_json": b"\x00\xffnot json",
    "empty": b"",
    "binary": bytes(range(256)) * 40,
    "invalid_utf8_json": b'{"prompt": "\xff\xfe how do we run migrations", "session_id": "s"}',
    "array": b'["how do we run the database migrations?"]',
    "string": b'"how do we run the database migrations?"',
    "wrong_types": b'{"prompt": 42, "session_id": ["x"]}',
    "prompt_null": b'{"prompt": null, "session_id": "s"}',
    "no_prompt": b'{"session_id": "s", "hook_event_name": "UserPromptSubmit"}',
    "nan": b'{"prompt": "how do we run the database migrations?", "n": NaN}',
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "huge": b'{"prompt": "' + b"a" * (5 * 1024 * 1024) + b'"}',  # over the 4 MiB stdin cap
    "trailing": b'{"prompt": "how do we run the database migrations?"} {}',
    "truncated": b'{"session_id": "s3", "prompt',
}


@pytest.mark.parametrize("kind", sorted(MALFORMED_STDIN))
def test_malformed_stdin_ends_silently(tmp_path, kind):
    # ROOMY: a hook started late under load logged `no_budget_left` (a timeout), or for 5 MiB
    # of stdin `stdin_timeout`, in place of the input's fault. It must still end at once.
    with FakeRelay(reply(200, results(record("mem_a")))) as server:
        hook = Hook(tmp_path, server.url, RELAY_DEADLINE_MS=str(ROOMY))
        run = hook.run(MALFORMED_STDIN[kind])
        assert_silent(run)
        assert run.ms <= DEADLINE + SLACK
        assert server.requests == []
    assert hook.last()["outcome"] == "skipped"
    # and the log says why (QA, session 6: a truncated object logged no reason at all: the
    # JSON scanner failed with a SystemError the hook did not expect)
    assert hook.last()["reason"] in ("bad_input", "stdin_too_large")


def test_stdin_never_closed_ends_by_the_deadline(tmp_path):
    # Twice DEADLINE: at 300 ms a hook started late under load (after 275 ms, its exit
    # reserve) rightly logged `no_budget_left` before it ever waited on stdin.
    deadline = 2 * DEADLINE
    hook = Hook(tmp_path, "http://127.0.0.1:9", RELAY_DEADLINE_MS=str(deadline))
    started = time.monotonic()
    with subprocess.Popen(
        [str(HOOK)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=hook.env
    ) as proc:
        proc.stdin.write(b'{"prompt": "how do we')
        proc.stdin.flush()
        out = proc.stdout.read()  # EOF when the hook exits, while its stdin is still open
        elapsed = (time.monotonic() - started) * 1000
        assert proc.wait(5) == 0
    assert out == b""
    assert elapsed <= deadline + SLACK
    assert hook.last()["reason"] == "stdin_timeout"
    # by its own clock it stopped waiting in time to log and exit inside the deadline (QA:
    # it waited the whole budget and logged 300.57 ms of 300)
    assert hook.last()["ms"]["total"] < deadline


def test_a_process_that_starts_after_its_deadline_is_no_stdin_timeout(tmp_path):
    """QA: under load a run logged `stdin_timeout` with stdin ready (`ms.stdin` 0.17) but
    `ms.start` 411 of a 400 ms budget: the process started late, and `relay stats` blamed the
    agent's stdin. The interpreter here sleeps before it reaches the hook, as a loaded
    machine would, with the whole payload already waiting on stdin."""
    import sys

    with FakeRelay(reply(200, results(record("mem_a")))) as server:
        hook = Hook(tmp_path, server.url, RELAY_DEADLINE_MS=str(DEADLINE))
        late = subprocess.run(
            [
                sys.executable,
                "-c",
                f"import time; time.sleep({DEADLINE / 1000 + 0.05}); "
                "from relay.hook import main; main(['relay-hook'])",
            ],
            input=hook.payload(PROMPT),
            capture_output=True,
            env=hook.env,
            timeout=30,
        )
        assert (late.returncode, late.stdout) == (0, b"")
        assert server.requests == []
    entry = hook.last()
    assert entry["ms"]["start"] > DEADLINE
    assert (entry["outcome"], entry["reason"]) == ("timeout", "no_budget_left")


def test_a_deadline_too_short_to_ever_search_is_ignored(tmp_path):
    """QA: RELAY_DEADLINE_MS=50 was accepted (the documented range began at 50) and every
    prompt ended `timeout`, `no_budget_left`: 50 ms kept back for packing and 20 for the
    server leave nothing once the process has started. Below the least deadline that can
    search, the value is out of range and the layer below applies, here the config file's
    (the default's 400 ms, less a start of 280 ms under load, left the server 75 ms)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"deadline_ms": ROOMY}))
    with FakeRelay(reply(200, results(record("mem_a")))) as server:
        hook = Hook(tmp_path, server.url, RELAY_CONFIG=str(config), RELAY_DEADLINE_MS="50")
        assert_hit_contract(hook.prompt(PROMPT))
    assert hook.last()["deadline_ms"] > DEADLINE  # the server was given the file's budget


def test_missing_and_unknown_fields_are_tolerated(tmp_path):
    with FakeRelay(reply(200, results(record("mem_a")))) as server:
        hook = Hook(tmp_path, server.url)
        codex = {
            "prompt": PROMPT,
            "turn_id": "t-9",
            "model": "gpt-x",
            "session_id": "c1",
            "extra": {"a": [1]},
        }
        assert_hit_contract(hook.run(json.dumps(codex).encode()))
        assert hook.last()["prompt_id"] == "t-9"
        assert_hit_contract(hook.run(json.dumps({"prompt": PROMPT}).encode()))  # no session at all


def test_sigint_mid_request_still_exits_zero_silently(tmp_path):
    server = FakeRelay()
    server.handler = hung(server)
    with server:
        hook = Hook(tmp_path, server.url, RELAY_DEADLINE_MS="3000")
        with subprocess.Popen(
            [str(HOOK)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=hook.env,
        ) as proc:
            proc.stdin.write(hook.payload(PROMPT))
            proc.stdin.close()
            server.wait_for_requests(1)
            proc.send_signal(signal.SIGINT)
            out = proc.stdout.read()
            assert proc.wait(5) == 0
    assert out == b""


def test_a_state_folder_that_cannot_be_written_still_answers_and_logs_why(tmp_path):
    """QA: with ~/.relay/state unusable (a file in its place; root's after `sudo claude`),
    every prompt with a session id printed nothing and logged nothing, while the same
    prompt without one worked. It is answered as without a session id, and logged in the
    fallback folder, naming the state folder and why."""
    (tmp_path / "state").write_text("a file where the state directory should be")
    temp = tmp_path / "tmp"
    temp.mkdir()
    with FakeRelay(reply(200, results(record("mem_a")))) as server:
        hook = Hook(tmp_path, server.url, TMPDIR=str(temp))
        assert "mem_a" in assert_hit_contract(hook.prompt(PROMPT))
        start = hook.session_start("startup")
        assert "mem_a" in assert_hit_contract(start, "SessionStart")
    (folder,) = temp.iterdir()
    assert folder.stat().st_mode & 0o777 == 0o700
    logged = [json.loads(line) for line in (folder / "outcomes.jsonl").read_text().splitlines()]
    assert [(e["event"], e["outcome"]) for e in logged] == [
        ("prompt", "hit"),
        ("session_start", "hit"),
    ]
    for entry in logged:
        assert entry["session"] == "sess-1"
        assert entry["state_error"] == "Not a directory"
        assert entry["state_dir"] == str(tmp_path / "state")
    assert (tmp_path / "state").read_text() == "a file where the state directory should be"


def test_a_session_whose_lock_cannot_be_opened_is_answered_without_its_state(tmp_path):
    """A session's lock file the hook cannot open (another user's, after `sudo claude`; here
    a folder in its place, which root cannot open for writing either) is not a busy session:
    the prompt is answered without the session's state, and the log says why."""
    with FakeRelay(reply(200, results(record("mem_a")))) as server:
        hook = Hook(tmp_path, server.url)
        (tmp_path / "state" / "sessions" / "sess-1.lock").mkdir(parents=True)
        assert "mem_a" in assert_hit_contract(hook.prompt(PROMPT))
    entry = hook.last()
    assert entry["outcome"] == "hit" and entry["state_error"] == "Is a directory"


def test_a_fallback_folder_someone_else_made_gets_no_log(tmp_path):
    """The fallback folder is in a shared temporary directory: one open to others (made in
    advance by another user) is not written, and the prompt is answered all the same."""
    (tmp_path / "state").write_text("not a folder")
    temp = tmp_path / "tmp"
    temp.mkdir()
    with FakeRelay(reply(200, results(record("mem_a")))) as server:
        hook = Hook(tmp_path, server.url, TMPDIR=str(temp))
        hook.prompt("a first prompt to learn where the fallback folder is")
        (folder,) = temp.iterdir()
        (folder / "outcomes.jsonl").unlink()
        folder.chmod(0o777)
        assert "mem_a" in assert_hit_contract(hook.prompt(PROMPT))
    assert list(folder.iterdir()) == []


def test_kill_switch_and_missing_configuration_are_silent(tmp_path):
    with FakeRelay(reply(200, results(record("mem_a")))) as server:
        hook = Hook(tmp_path, server.url, RELAY_MEMORY_OFF="1")
        assert_silent(hook.prompt(PROMPT))
        assert hook.last()["outcome"] == "disabled" and hook.last()["reason"] == "memory_off"
        assert_silent(hook.session_start("startup"))
        assert hook.last()["outcome"] == "disabled"
        hook = Hook(tmp_path / "b", None)
        assert_silent(hook.prompt(PROMPT))
        assert hook.last() | {"ts": 0, "ms": 0} == {**hook.last(), "ts": 0, "ms": 0}
        assert hook.last()["outcome"] == "disabled" and hook.last()["reason"] == "not_configured"
        # a config file there but unusable is not the same as none
        # (a byte-order mark before the JSON is read past: test_hook_units)
        for text in ('{"url": "http://relay:8765" "api_key": "relay_x_y"}', "[]", "\ufeff[]"):
            broken = tmp_path / "broken.json"
            broken.write_text(text)
            hook = Hook(tmp_path / "d", None, RELAY_CONFIG=str(broken))
            assert_silent(hook.prompt(PROMPT))
            assert hook.last()["outcome"] == "disabled", text
            assert hook.last()["reason"] == "bad_config", text
        hook = Hook(tmp_path / "c", "ftp://relay", RELAY_API_KEY="relay_x_y")
        assert_silent(hook.prompt(PROMPT))
        assert hook.last()["reason"] == "bad_url"
        assert server.requests == []


@pytest.mark.parametrize(
    "key_file, env",
    [
        (b"\xef\xbb\xbfrelay_x_0123456789abcdef\n", {}),  # saved with a byte-order mark
        (b"relay_x_0123 456789abcdef\n", {}),  # a space inside
        ("relay_x_0123456789abcdéf\n".encode(), {}),  # not ASCII
        (None, {}),  # named by the config file, and missing
        ("directory", {}),  # there, and cannot be read as a file
        (None, {"RELAY_API_KEY_FILE": "/nonexistent/relay-key"}),
        (b"", {"RELAY_API_KEY": "relay_x_0123\x7f456789abcdef"}),  # an inline key: the same
    ],
)
def test_a_key_that_cannot_be_used_is_logged_as_bad_key(tmp_path, key_file, env):
    """QA: a key file the hook cannot use (a byte-order mark, a space or a character that is
    not ASCII in it, missing, unreadable) was logged `not_configured`, like a machine never
    set up, so `relay stats` pointed nowhere near the broken install."""
    path = tmp_path / "key"
    if key_file == "directory":
        path.mkdir()
    elif key_file is not None:
        path.write_bytes(key_file)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"url": "http://127.0.0.1:9", "api_key_file": str(path)}))
    hook = Hook(tmp_path, None, RELAY_CONFIG=str(config), **env)
    assert_silent(hook.prompt(PROMPT))
    assert (hook.last()["outcome"], hook.last()["reason"]) == ("disabled", "bad_key")
    assert_silent(hook.session_start("startup"))
    assert (hook.last()["outcome"], hook.last()["reason"]) == ("disabled", "bad_key")


def _closed_fds_run(hook: Hook, redirects: str, stdin: bytes) -> subprocess.CompletedProcess:
    """The real hook started by a shell with some of its standard fds closed (`>&-`)."""
    return subprocess.run(
        ["sh", "-c", f'exec "$0" {redirects}', str(HOOK)],
        input=stdin,
        capture_output=True,
        env=hook.env,
        timeout=30,
    )


def test_a_closed_stdout_is_a_logged_failure_and_nothing_lands_in_a_file(tmp_path):
    """QA: with stdout closed the session lock took fd 1, the hook wrote its answer into the
    lock file, logged a hit and put the records in the ledger."""
    with FakeRelay(reply(200, results(record("mem_a")))) as server:
        hook = Hook(tmp_path, server.url)
        done = _closed_fds_run(hook, ">&-", hook.payload(PROMPT, prompt_id="p1"))
        assert done.returncode == 0 and done.stderr == b""
        entry = hook.last()
        assert (entry["outcome"], entry["reason"]) == ("skipped", "stdout_closed"), entry
        assert "injected" not in entry and server.requests == []
        for path in (hook.state_dir / "sessions").glob("*"):
            assert b"hookSpecificOutput" not in path.read_bytes(), path
        assert not (hook.state_dir / "sessions" / "sess-1.json").exists()  # nothing counted
        # the prompt's other run, with its stdout, answers it: nothing was recorded as shown
        assert "mem_a" in assert_hit_contract(hook.prompt(PROMPT, prompt_id="p1"))
        # a closed stderr (or stdin) changes nothing else
        done = _closed_fds_run(hook, "2>&-", hook.payload(PROMPT + " again", session="s2"))
        assert json.loads(done.stdout)["hookSpecificOutput"]["additionalContext"]
        assert hook.last()["outcome"] == "hit"
        done = _closed_fds_run(hook, "<&-", b"")
        assert done.stdout == b"" and hook.last()["reason"] == "bad_input"


def test_a_reader_that_goes_away_is_a_named_failure_and_leaves_the_ledger_alone(tmp_path):
    """QA: with a broken pipe the log said `skipped` with no reason."""
    with FakeRelay(reply(200, results(record("mem_a")))) as server:
        hook = Hook(tmp_path, server.url, RELAY_THROTTLE_PROMPTS="0")
        proc = subprocess.Popen(
            [str(HOOK)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=hook.env,
        )
        proc.stdout.close()  # the reader goes away before the answer is written
        proc.stdin.write(hook.payload(PROMPT, prompt_id="p1"))
        proc.stdin.close()
        assert proc.wait(30) == 0
        assert proc.stderr.read() == b""
        proc.stderr.close()
        entry = hook.last()
        assert (entry["outcome"], entry["reason"]) == ("skipped", "stdout_broken_pipe"), entry
        assert "injected" not in entry and len(server.requests) == 1
        assert hook.session_state()["ledger"] == {}
        # not shown, so not a duplicate: the next prompt that finds it injects it
        run = hook.prompt("which migration convention applies to the invoices table?")
        assert "mem_a" in assert_hit_contract(run)


# Written loosely, each is a number to Python's int() or float(): 1000, or 0.9.
LOOSE_WHOLE = ["1_000", " 1000", "1000 ", "+1000", "\u0661\u0660\u0660\u0660"]
LOOSE_DECIMAL = ["0.9_0", " 0.9", "0.9 ", "+0.9", "\u0660.\u0669", "9e-1"]


@pytest.mark.parametrize(
    "knob",
    [("RELAY_MIN_PROMPT_LEN", text) for text in LOOSE_WHOLE]
    + [("RELAY_MIN_SCORE", text) for text in LOOSE_DECIMAL],
)
def test_a_number_written_loosely_is_a_bad_value_the_hook_ignores(tmp_path, knob):
    """QA: RELAY_DEADLINE_MS=4_00 was taken as 400: the hook read its numbers with int() and
    float(), which also take underscores, a sign, spaces around and other scripts' digits,
    where every integer option of the CLI refuses them. The hook reads them by the CLI's rule
    (relay.numerals), and one written loosely is a bad value like any other: ignored, the
    default kept (`relay doctor` names it), never a prompt broken. Here, read as 1000 or 0.9,
    the knob would have skipped the prompt (shorter than 1000) or dropped its result (scored
    0.7); at the defaults (15, 0.2) the result is injected."""
    variable, text = knob
    with FakeRelay(reply(200, results(record("mem_1", score=0.7)))) as server:
        hook = Hook(tmp_path, server.url, **{variable: text})
        assert "mem_1" in assert_hit_contract(hook.prompt(PROMPT))


def test_a_port_written_loosely_is_a_bad_url(tmp_path):
    """QA: RELAY_URL=http://127.0.0.1:80_80 reached port 8080 (int() read the port), where
    `relay` commands refuse that URL (urllib): the hook takes the port's digits alone."""
    with FakeRelay(reply(200, results(record("mem_1")))) as server:
        port = server.url.rsplit(":", 1)[1]
        loose = server.url.removesuffix(port) + port[0] + "_" + port[1:]
        hook = Hook(tmp_path, loose)
        assert_silent(hook.prompt(PROMPT))
        assert (hook.last()["outcome"], hook.last()["reason"]) == ("disabled", "bad_url")
        assert server.requests == []
