"""The circuit breaker, shared by every hook process: open, cool down, one probe, close."""

from __future__ import annotations

import json
import time

from hook_support import (
    FakeRelay,
    Hook,
    assert_hit_contract,
    assert_silent,
    record,
    reply,
    results,
    run_together,
)

PROMPT = "how do we write a database migration for the orders table?"
# A timeout counts only once the request went out: at 400 ms a hook started late under load
# sent nothing (`no_budget_left`), so the breaker never opened ('timeout' == 'circuit_open',
# and KeyError 'probe', with three busy loops on two cores).
DEADLINE_MS = 800


def breaker_hook(tmp_path, url: str, deadline_ms: int = DEADLINE_MS) -> Hook:
    return Hook(
        tmp_path,
        url,
        RELAY_DEADLINE_MS=str(deadline_ms),
        RELAY_BREAKER_FAILURES="2",
        RELAY_BREAKER_COOLDOWN_S="1",
        RELAY_THROTTLE_PROMPTS="0",
        RELAY_OVERLAP_THRESHOLD="1.5",
    )


def cool_down(hook: Hook) -> None:
    """Move the breaker's opening back past its 1 s cool-down, rather than sleep through it."""
    path = hook.state_dir / "breaker.json"
    state = json.loads(path.read_text())
    assert state["opened_at"] is not None, state  # open: both failures were counted
    state["opened_at"] -= 1.1
    path.write_text(json.dumps(state))


def run_concurrently(hook: Hook, n: int) -> list[bytes]:
    done = run_together(hook, [hook.payload(PROMPT, session=f"c{i}") for i in range(n)])
    assert all(rc == 0 for rc, _ in done)
    return [out for _, out in done]


def test_breaker_opens_probes_once_and_closes(tmp_path):
    server = FakeRelay()
    healthy = reply(200, results(record("mem_a")))
    server.handler = lambda conn, request: server.wait(10)
    with server:
        hook = breaker_hook(tmp_path, server.url)
        for _ in range(2):
            assert_silent(hook.prompt(PROMPT))
            assert (hook.last()["outcome"], hook.last().get("reason")) == ("timeout", "network")
        # open: no connection at all, and fast
        before = server.connections
        run = hook.prompt(PROMPT)
        assert_silent(run)
        assert hook.last()["outcome"] == "circuit_open"
        assert server.connections == before
        # fast: no network, nor the deadline waited out as by the two before it (`run.ms < 250`
        # measured the process's start: 428 ms for this run, with three busy loops)
        assert "net" not in hook.last()["ms"] and run.ms < DEADLINE_MS
        # after the cool-down exactly one of several concurrent prompts probes
        cool_down(hook)
        # The probe's answer is slow, so the others start while the breaker is half-open;
        # one that starts after the probe closed it may search normally, which is right.
        server.handler = lambda conn, request: (server.wait(0.5), healthy(conn, request))
        # a generous deadline here: four hooks start at once on a shared machine
        hook = breaker_hook(tmp_path, server.url, deadline_ms=3000)
        outs = run_concurrently(hook, 4)
        entries = hook.outcomes()[-4:]
        probes = [e for e in entries if e.get("probe")]
        assert len(probes) == 1 and probes[0]["outcome"] == "hit"
        hits = [e for e in entries if e["outcome"] == "hit"]
        assert len(hits) + sum(e["outcome"] == "circuit_open" for e in entries) == 4
        assert sum(e["outcome"] == "circuit_open" for e in entries) >= 2
        assert server.connections == before + len(hits)
        assert sum(1 for out in outs if out) == len(hits)
        server.handler = healthy
        # the successful probe closed it: everyone searches again
        assert_hit_contract(hook.prompt(PROMPT, session="after"))
        assert not (hook.state_dir / "breaker.json").exists()


def test_failed_probe_reopens_for_another_cool_down(tmp_path):
    server = FakeRelay()
    server.handler = lambda conn, request: server.wait(10)
    with server:
        hook = breaker_hook(tmp_path, server.url)
        hook.prompt(PROMPT)
        hook.prompt(PROMPT)
        cool_down(hook)
        assert_silent(hook.prompt(PROMPT))
        assert hook.last()["outcome"] == "timeout" and hook.last()["probe"] is True
        assert_silent(hook.prompt(PROMPT))
        assert hook.last()["outcome"] == "circuit_open"
        state = json.loads((hook.state_dir / "breaker.json").read_text())
        assert state["failures"] == 3 and state["probe_at"] is None


def test_unavailable_counts_and_answers_reset(tmp_path):
    server = FakeRelay(reply(500, {"error": "boom"}))
    with server:
        # nothing hangs here: a roomy deadline keeps machine load from faking timeouts
        hook = breaker_hook(tmp_path, server.url, deadline_ms=2000)
        assert_silent(hook.prompt(PROMPT))
        assert hook.last()["outcome"] == "unavailable"
        # any answer from the server (here a 401) means it is reachable: failures reset
        server.handler = reply(401, {"error": {"code": "unauthorized"}})
        hook.prompt(PROMPT)
        assert not (hook.state_dir / "breaker.json").exists()
        server.handler = reply(500, {"error": "boom"})
        hook.prompt(PROMPT)
        hook.prompt(PROMPT)
        assert_silent(hook.prompt(PROMPT))
        assert hook.last()["outcome"] == "circuit_open"


def test_breaker_state_for_another_url_is_ignored(tmp_path):
    server = FakeRelay(reply(500, {"error": "boom"}))
    with server:
        hook = breaker_hook(tmp_path, server.url, deadline_ms=2000)
        hook.prompt(PROMPT)
        hook.prompt(PROMPT)
        with FakeRelay(reply(200, results(record("mem_a")))) as other:
            moved = breaker_hook(tmp_path, other.url, deadline_ms=2000)
            assert_hit_contract(moved.prompt(PROMPT, session="moved"))


def test_a_clock_set_back_does_not_hold_the_breaker_open(tmp_path):
    """Opened while the machine's clock ran two hours fast, then set right: the cool-down is
    over (one probe goes), not two hours away; a probe claimed then is not pending either."""
    server = FakeRelay(reply(200, results(record("mem_a"))))
    with server:
        hook = breaker_hook(tmp_path, server.url, deadline_ms=2000)
        hook.state_dir.mkdir(parents=True)
        path = hook.state_dir / "breaker.json"
        ahead = time.time() + 7200
        for probe_at in (None, ahead):
            stamped = {"url": server.url, "failures": 2, "opened_at": ahead, "probe_at": probe_at}
            path.write_text(json.dumps(stamped))
            assert breaker_status(hook, server.url)["state"] == "half_open"
            assert_hit_contract(hook.prompt(PROMPT, session=f"s{probe_at}"))
            assert hook.last()["probe"] is True
            assert not path.exists()
        # a stamp a moment ahead (another process's clock reading) still counts as open
        path.write_text(json.dumps({**stamped, "opened_at": time.time() + 1, "probe_at": None}))
        assert_silent(hook.prompt(PROMPT, session="moment"))
        assert hook.last()["outcome"] == "circuit_open"


def breaker_status(hook: Hook, url: str) -> dict:
    from relay.hook import breaker

    return breaker.status(str(hook.state_dir), url, 1.0)
