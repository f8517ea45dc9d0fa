"""`relay stats` over a log the real hook wrote."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner
from hook_support import FakeRelay, Hook, record, reply, results

from relay.hook import config
from relay.hook_stats import parse_since, stats, summarise


def test_stats_counts_outcomes_tokens_duplicates_and_reports_a_bad_key_loudly(tmp_path):
    answer = {"handler": reply(200, results(record("mem_a"), record("mem_b")))}
    with FakeRelay(lambda conn, request: answer["handler"](conn, request)) as server:
        hook = Hook(tmp_path, server.url, RELAY_THROTTLE_PROMPTS="0", RELAY_OVERLAP_THRESHOLD="1.5")
        hook.prompt("how do we write a database migration?")  # hit, 2 records
        hook.prompt("how do we write a database migration?")  # no_match, 2 duplicates
        hook.prompt("ok")  # skipped
        answer["handler"] = reply(401, {"error": {"code": "unauthorized"}})
        hook.prompt("how do we write a database migration?")
        hook.prompt("how do we write a database migration?")
    summary = summarise(str(hook.state_dir), since_s=3600)
    assert summary["invocations"] == 5
    assert summary["outcomes"]["hit"] == 1
    assert summary["outcomes"]["no_match"] == 1
    assert summary["outcomes"]["skipped"] == 1
    assert summary["outcomes"]["unauthorized"] == 2
    assert summary["skip_reasons"] == {"skipped:short_prompt": 1}
    assert summary["injected"]["records"] == 2 and summary["injected"]["tokens"] > 0
    assert summary["duplicates_avoided"] == 2
    assert summary["unauthorized_streak"]["length"] == 2
    assert summary["hook_ms"]["p50"] > 0
    assert any("rejected (401/403)" in p for p in summary["problems"])

    result = CliRunner().invoke(stats, ["--state-dir", str(hook.state_dir), "--since", "1h"])
    assert result.exit_code == 0
    assert result.output.startswith("PROBLEM: the last 2 searches were rejected")
    # what was searched and what was not are counted apart, each reason under its outcome
    assert "searched 4, of which:" in result.output
    assert "not searched 1, of which:\n    skipped           1\n      short_prompt" in result.output
    as_json = CliRunner().invoke(stats, ["--state-dir", str(hook.state_dir), "--json"])
    assert json.loads(as_json.output)["outcomes"]["hit"] == 1


def test_stats_on_an_empty_or_torn_log(tmp_path):
    (tmp_path / "outcomes.jsonl").write_text(
        '{"ts": "2026-11-29T00:00:00.000Z", "outcome": "hit"\n'
    )
    summary = summarise(str(tmp_path), since_s=None)
    assert summary["invocations"] == 0 and summary["problems"] == []
    shown = CliRunner().invoke(stats, ["--state-dir", str(tmp_path), "--since", "all"]).output
    # QA: nothing logged read as hook times of 0.0 ms
    assert "  hook time ms      - (none)\n  on hits ms        - (none)\n" in shown, shown
    # QA: "not searched 0, of which:" led on to nothing
    assert "  searched 0\n" in shown and "  not searched 0\n" in shown, shown
    assert "of which" not in shown, shown
    result = CliRunner().invoke(stats, ["--state-dir", str(tmp_path), "--since", "soon"])
    assert result.exit_code == 2


def test_a_timeout_before_any_request_is_not_counted_as_searched(tmp_path):
    """QA (second pass): a run whose budget was gone before it could send its request
    (timeout, no_budget_left) was listed under 'searched'."""
    lines = [
        {"outcome": "hit", "ms": {"total": 40}},
        {"outcome": "timeout", "reason": "no_budget_left", "ms": {"total": 390}},
        {"outcome": "skipped", "reason": "short_prompt", "ms": {"total": 5}},
    ]
    (tmp_path / "outcomes.jsonl").write_text(
        "".join(json.dumps({"ts": "2026-11-29T00:00:00.000Z", **e}) + "\n" for e in lines)
    )
    text = CliRunner().invoke(stats, ["--state-dir", str(tmp_path), "--since", "all"]).output
    assert "searched 1, of which:" in text and "    timeout           0" in text
    assert "not searched 2, of which:" in text
    assert "    timeout           1\n      no_budget_left" in text
    summary = summarise(str(tmp_path), since_s=None)
    assert summary["searched"]["timeout"] == 0 and summary["searched"]["hit"] == 1
    assert summary["not_searched"] == {"skipped": 1, "timeout": 1}


def test_an_answer_that_could_not_be_written_counts_as_searched(tmp_path):
    """QA: runs the server answered but whose answer could not be written (skipped,
    stdout_broken_pipe or stdout_unwritable) were listed under 'not searched', beside
    runs that never asked; and they did not end a server-down streak, though it answered."""
    lines = [
        {"outcome": "unavailable"},
        {"outcome": "unavailable"},
        {"outcome": "timeout", "reason": "late"},
        {"outcome": "skipped", "reason": "stdout_broken_pipe", "url": "http://relay"},
        {"outcome": "skipped", "reason": "stdout_unwritable", "url": "http://relay"},
        {"outcome": "skipped", "reason": "stdout_closed"},
        {"outcome": "skipped", "reason": "short_prompt"},
    ]
    (tmp_path / "outcomes.jsonl").write_text(
        "".join(json.dumps({"ts": "2026-11-29T00:00:00.000Z", **e}) + "\n" for e in lines)
    )
    summary = summarise(str(tmp_path), since_s=None)
    assert summary["searched"]["skipped"] == 2 and sum(summary["searched"].values()) == 5
    assert summary["not_searched"] == {"skipped": 2}
    assert summary["unavailable_streak"]["length"] == 0 and summary["problems"] == []
    text = CliRunner().invoke(stats, ["--state-dir", str(tmp_path), "--since", "all"]).output
    searched, _, not_searched = text.partition("  not searched 2, of which:\n")
    assert "  searched 5, of which:" in searched
    assert "    skipped           2\n      stdout_broken_pipe        1\n" in searched
    assert "      stdout_unwritable         1\n" in searched and "short_prompt" not in searched
    assert not_searched.startswith("    skipped           2\n      short_prompt")
    assert "stdout_closed" in not_searched and "stdout_broken_pipe" not in not_searched


def test_timeouts_that_sent_nothing_make_no_server_down_streak(tmp_path):
    """A slow machine that spent the budget before the request is not a server that is
    down: those runs neither count in nor break the timeout/unavailable streak."""
    lines = [
        {"outcome": "unavailable"},
        {"outcome": "timeout", "reason": "no_budget_left"},
        {"outcome": "timeout", "reason": "no_budget_left"},
        {"outcome": "timeout", "reason": "no_budget_left"},
        {"outcome": "timeout", "reason": "late"},
    ]
    (tmp_path / "outcomes.jsonl").write_text(
        "".join(json.dumps({"ts": "2026-11-29T00:00:00.000Z", **e}) + "\n" for e in lines)
    )
    summary = summarise(str(tmp_path), since_s=None)
    assert summary["unavailable_streak"]["length"] == 2
    assert summary["problems"] == []


def test_parse_since():
    assert parse_since("24h") == 86400
    assert parse_since("30m") == 1800
    for bad in ("-1d", "bogus", "xh"):
        with pytest.raises(ValueError, match="period"):
            parse_since(bad)
    # QA: a period reaching before year 1 was a traceback (year out of range)
    with pytest.raises(ValueError, match="longer than 100 years: 'all' means everything"):
        parse_since("99999999w")
    done = CliRunner().invoke(stats, ["--since", "99999999w"])
    assert done.exit_code == 2 and "Traceback" not in done.output
    # the number read as every decimal option reads one: float() took `1_0d` as ten days
    assert parse_since("1.5h") == parse_since(".5h") * 3 == 5400
    for loose in ("1_0d", "+1d", "1 d", "1e1d", "\u0661d", "nand", "infd"):
        with pytest.raises(ValueError, match="is not a number followed by s, m, h, d or w"):
            parse_since(loose)


def test_the_breaker_reported_is_the_configured_urls(tmp_path):
    """QA: hook runs with RELAY_URL set to another (slow) server left breaker.json for that
    URL, and `relay stats` and `relay doctor` said the breaker was open although the hook,
    configured for its usual URL, ignores that state (docs/hook.md) and searched normally."""
    with FakeRelay(reply(500, {"error": "boom"})) as elsewhere:
        hook = Hook(tmp_path, elsewhere.url, RELAY_BREAKER_FAILURES="2")
        for session in ("s1", "s2"):
            hook.prompt("how do we write a database migration?", session=session)
    assert hook.last()["outcome"] == "unavailable"
    state_dir = str(hook.state_dir)
    env = {"RELAY_URL": "http://127.0.0.1:8893", "RELAY_CONFIG": str(tmp_path / "none.json")}
    text = CliRunner().invoke(stats, ["--state-dir", state_dir, "--since", "all"], env=env)
    assert "circuit breaker" not in text.output
    assert "breaker           closed for http://127.0.0.1:8893" in text.output

    def settings(url: str) -> config.Config:
        return config.load({"RELAY_URL": url, "RELAY_CONFIG": str(tmp_path / "none.json")})

    usual = summarise(state_dir, None, cfg=settings("http://127.0.0.1:8893"))
    assert usual["breaker"]["state"] == "closed" and usual["breaker"]["failures"] == 0
    assert not any("breaker" in p for p in usual["problems"])
    there = summarise(state_dir, None, cfg=settings(elsewhere.url))
    assert there["breaker"]["state"] == "open" and there["breaker"]["failures"] == 2
    assert f"the hook's circuit breaker for {elsewhere.url} is open" in there["problems"]


def test_a_streak_speaks_only_of_the_configured_server(tmp_path):
    """Runs that asked another server (RELAY_URL set for one session) said nothing about the
    configured one, yet counted in its 'timed out or found no server' streak (and a run of
    the configured server's between them did not break it)."""
    from relay.hook import config as hook_config

    here, there = "http://127.0.0.1:8765", "http://127.0.0.1:9999"
    lines = [
        {"outcome": "hit", "url": here},
        {"outcome": "unavailable", "url": there},
        {"outcome": "unavailable", "url": there},
        {"outcome": "timeout", "url": there},
        {"outcome": "unavailable"},  # a line from before urls were logged: still counts
    ]
    (tmp_path / "outcomes.jsonl").write_text(
        "".join(json.dumps({"ts": "2026-11-29T00:00:00.000Z", **e}) + "\n" for e in lines)
    )
    cfg = hook_config.load({"RELAY_URL": here, "RELAY_CONFIG": str(tmp_path / "none.json")})
    summary = summarise(str(tmp_path), since_s=None, cfg=cfg)
    assert summary["unavailable_streak"]["length"] == 1 and summary["problems"] == []
    cfg = hook_config.load({"RELAY_URL": there, "RELAY_CONFIG": str(tmp_path / "none.json")})
    summary = summarise(str(tmp_path), since_s=None, cfg=cfg)
    assert summary["unavailable_streak"]["length"] == 4
    # QA: it said "check RELAY_URL" when the URL came from the config file
    assert summary["problems"] == [
        "the last 4 searches timed out or found no server since 2026-11-29T00:00:00.000Z: check"
        f" that the server at {there} is up and reachable from here (relay doctor checks each"
        " link)"
    ]


def test_a_number_beyond_a_float_is_a_corrupt_line_and_json_stays_json(tmp_path):
    """QA: a log line with "total": 1e400 read as infinity: the percentiles were infinite and
    `relay stats --json` printed Infinity, which no JSON parser takes."""
    good = {"ts": "2026-11-29T00:00:00.000Z", "outcome": "hit", "ms": {"total": 12.5}}
    lines = [
        json.dumps(good),
        '{"ts": "2026-11-29T00:00:01.000Z", "outcome": "hit", "ms": {"total": 1e400}}',
        '{"ts": "2026-11-29T00:00:02.000Z", "outcome": "hit", "ms": {"total": NaN}}',
    ]
    (tmp_path / "outcomes.jsonl").write_text("\n".join(lines) + "\n")
    done = CliRunner().invoke(stats, ["--state-dir", str(tmp_path), "--since", "all", "--json"])
    assert done.exit_code == 0, done.output
    assert "Infinity" not in done.output and "NaN" not in done.output
    summary = json.loads(done.output, parse_constant=lambda c: pytest.fail(c))
    assert summary["invocations"] == 1 and summary["hook_ms"]["p99"] == 12.5


def test_a_state_dir_that_is_not_there_is_refused(tmp_path):
    """QA: `relay stats --state-dir /nonexistent` exited 0 with 0 prompts and a "breaker
    closed for http://..." line it made up."""
    gone = tmp_path / "nonexistent"
    done = CliRunner().invoke(stats, ["--state-dir", str(gone)])
    assert done.exit_code == 2, done.output
    assert f"Directory '{gone}' does not exist" in done.output and "breaker" not in done.output


def test_send_without_a_server_names_what_stats_takes(tmp_path):
    """QA: `relay stats --send` on a machine without an install said "pass --url", which
    stats has no option for; and it printed the whole report before the error."""
    from integration_support import relay

    done = relay(tmp_path, "stats", "--send")
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr == "relay: error: no server URL: set RELAY_URL or run 'relay install'\n"
    done = relay(tmp_path, "stats", "--send", RELAY_URL="http://127.0.0.1:9")
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr == (
        "relay: error: no API key: set RELAY_API_KEY (or RELAY_API_KEY_FILE) or run"
        " 'relay install'\n"
    )


def test_a_fallback_log_folder_that_is_not_this_users_alone_is_not_read(tmp_path, monkeypatch):
    """Review: `relay stats` read the hook's fallback log folder ($TMPDIR/relay-hook-UID)
    whatever it was, so another user could plant runs there (a folder made in advance, open
    to others, or a symlink); the hook itself logs only in a folder of this user's alone."""
    import os

    from relay.hook.outcome_log import LOG_NAME, fallback_dir

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    state = tmp_path / "state"
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o700)
    entry = {"ts": "2026-01-01T00:00:00.000Z", "outcome": "hit", "state_dir": str(state)}
    (planted / LOG_NAME).write_text(json.dumps(entry) + "\n")
    fallback = fallback_dir(os.environ)
    os.rename(planted, fallback)
    assert summarise(str(state), since_s=None)["invocations"] == 1  # this user's: read
    os.chmod(fallback, 0o733)
    assert summarise(str(state), since_s=None)["invocations"] == 0  # open to others
    os.chmod(fallback, 0o700)
    os.chown(fallback, 65534, 65534)
    assert summarise(str(state), since_s=None)["invocations"] == 0  # another user's
    os.chown(fallback, os.getuid(), os.getgid())
    os.rename(fallback, planted)
    os.symlink(planted, fallback)
    assert summarise(str(state), since_s=None)["invocations"] == 0  # a link to elsewhere


MIGRATION_PROMPT = "how do we write a database migration for the stats-keys orders table?"


def configured(home, url: str, key: str) -> str:
    """A config file naming `url` and a key file holding `key`, as `relay install` leaves
    them; returns the config file's path."""
    relay_dir = home / ".relay"
    relay_dir.mkdir(exist_ok=True)
    (relay_dir / "key").write_text(key + "\n")
    path = relay_dir / "config.json"
    path.write_text(json.dumps({"url": url, "api_key_file": str(relay_dir / "key")}))
    return str(path)


def test_a_rejected_key_the_environment_set_is_named_not_the_configured_one(tmp_path, live_server):
    """QA: prompts run with RELAY_API_KEY (a stale export) in place of the installed key were
    rejected, and `relay stats` said the hook's API key was revoked: the installed key, which
    worked. The log now says which key each search sent (its id, never the secret)."""
    from integration_support import mint, revoke

    url, admin = live_server.url, live_server.admin_key
    good = mint(url, admin, "stats-keys-env-good", ["memory:read"])
    stale = mint(url, admin, "stats-keys-env-stale", ["memory:read"])
    revoke(url, admin, stale["id"])
    config_file = configured(tmp_path, url, good["secret"])
    hook = Hook(tmp_path, None)
    hook.prompt(MIGRATION_PROMPT, session="installed")
    for session in ("exported-1", "exported-2"):
        hook.run(hook.payload(MIGRATION_PROMPT, session), env={"RELAY_API_KEY": stale["secret"]})
    first, *_, last = hook.outcomes()
    assert first["outcome"] in ("hit", "no_match") and first["key"] == good["id"]
    assert "key_from" not in first
    assert (last["outcome"], last["key"], last["key_from"]) == (
        "unauthorized",
        stale["id"],
        "RELAY_API_KEY",
    )
    log = (hook.state_dir / "outcomes.jsonl").read_text()
    assert good["secret"] not in log and stale["secret"] not in log

    cfg = config.load({"RELAY_CONFIG": config_file})
    summary = summarise(str(hook.state_dir), None, cfg=cfg)
    assert summary["unauthorized_streak"] == {"length": 0, "since": None, "key": good["id"]}
    (rejected,) = summary["rejected_keys"]
    assert (rejected["key"], rejected["from"], rejected["length"]) == (
        stale["id"],
        "RELAY_API_KEY",
        2,
    )
    assert summary["problems"] == [
        f"key {stale['id']}, which RELAY_API_KEY in an agent's environment set in place of the"
        f" configured key {good['id']}, was rejected (401/403) on the last 2 searches since"
        f" {rejected['since']}: prompts run there recall nothing until RELAY_API_KEY is unset"
        " or names a valid key"
    ]
    args = ["--state-dir", str(hook.state_dir), "--since", "all"]
    text = CliRunner().invoke(stats, args, env={"RELAY_CONFIG": config_file}).output
    assert text.startswith(f"PROBLEM: key {stale['id']}, which RELAY_API_KEY"), text
    assert "the hook's API key" not in text


def test_rejections_of_a_key_replaced_since_are_not_the_new_keys(tmp_path, live_server):
    """QA: after a revoked key was replaced (the key file rewritten), `relay stats` went on
    saying the hook's API key was revoked until a prompt had used the new one."""
    from integration_support import mint, revoke

    url, admin = live_server.url, live_server.admin_key
    old = mint(url, admin, "stats-keys-old", ["memory:read"])
    revoke(url, admin, old["id"])
    config_file = configured(tmp_path, url, old["secret"])
    hook = Hook(tmp_path, None)
    for session in ("before-1", "before-2"):
        hook.prompt(MIGRATION_PROMPT, session=session)
    assert [e["outcome"] for e in hook.outcomes()] == ["unauthorized"] * 2
    summary = summarise(str(hook.state_dir), None, cfg=config.load({"RELAY_CONFIG": config_file}))
    assert summary["unauthorized_streak"]["length"] == 2
    assert summary["problems"][0].endswith(
        f": the hook's API key {old['id']} is revoked, expired or lacks memory:read; recall is"
        " off until it is fixed"
    )

    new = mint(url, admin, "stats-keys-new", ["memory:read"])
    configured(tmp_path, url, new["secret"])
    summary = summarise(str(hook.state_dir), None, cfg=config.load({"RELAY_CONFIG": config_file}))
    assert summary["unauthorized_streak"] == {"length": 0, "since": None, "key": new["id"]}
    assert summary["problems"] == []
    (rejected,) = summary["rejected_keys"]
    assert (rejected["key"], rejected["from"], rejected["length"]) == (old["id"], None, 2)
    args = ["--state-dir", str(hook.state_dir), "--since", "all"]
    text = CliRunner().invoke(stats, args, env={"RELAY_CONFIG": config_file}).output
    assert "PROBLEM" not in text
    assert (
        f"  key {old['id']} rejected (401/403) on the last 2 searches since {rejected['since']},"
        f" and is not the key configured here ({new['id']})\n"
    ) in text


def test_a_period_parses_only_its_own_lines(tmp_path, monkeypatch):
    """QA: a summary for 24 hours parsed every line of the log, older ones included, so
    `relay stats` and `relay doctor` took two minutes on a 1 GiB log (log_max_bytes allows
    it). A line the hook stamped before the period, and a rotated file last written before
    it, are passed over unparsed; a line stamped otherwise is still judged by its time."""
    import os
    import time

    from relay.hook.outcome_log import timestamp

    monkeypatch.setenv("TMPDIR", str(tmp_path / "no-fallback"))
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    now = time.time()

    def line(at: float, outcome: str = "hit", spaced: bool = False) -> str:
        separators = (", ", ": ") if spaced else (",", ":")  # as a hand-edited line may be
        return json.dumps({"ts": timestamp(at), "outcome": outcome}, separators=separators)

    rotated = state_dir / "outcomes.jsonl.1"
    rotated.write_text("".join(line(now - 3 * 86400 + i) + "\n" for i in range(500)))
    os.utime(rotated, (now - 3 * 86400 + 500, now - 3 * 86400 + 500))
    current = [line(now - 2 * 86400 + i) for i in range(500)]
    current.append(line(now - 2 * 86400 + 600, spaced=True))
    current += [line(now - 60 + i, "no_match") for i in range(3)]
    current.append(line(now - 30, spaced=True))
    (state_dir / "outcomes.jsonl").write_text("\n".join(current) + "\n")

    parsed: list[str] = []
    loads = json.loads
    monkeypatch.setattr(json, "loads", lambda text, **kw: parsed.append(text) or loads(text, **kw))
    summary = summarise(str(state_dir), since_s=86400, now=now)
    assert summary["invocations"] == 4
    assert summary["outcomes"]["no_match"] == 3 and summary["outcomes"]["hit"] == 1
    # the three recent lines, and the two stamped otherwise, whatever their time
    assert len([text for text in parsed if '"ts"' in text]) == 5
    everything = summarise(str(state_dir), since_s=None, now=now)
    assert everything["invocations"] == 1005


def test_a_long_period_is_summarised_line_by_line_not_held_in_memory(tmp_path):
    """`relay stats --since all` on a 256 MB log (a raised log_max_bytes, months of lines)
    held every parsed line at once: 2 GB (QA). Read line by line, a summary's memory does not
    grow with the lines of its period; 60,000 lines grew it by 222 MB before."""
    import subprocess
    import sys

    phases = ("start", "stdin", "gate", "dns", "connect", "wait", "body", "net", "parse", "pack")
    line = {  # a no_match as the hook logs one
        "event": "prompt",
        "outcome": "no_match",
        "session": "s" * 36,
        "prompt_id": "p" * 36,
        "prompt_sha256": "0" * 16,
        "prompt_len": 60,
        "prompt_no": 3,
        "deadline_ms": 300,
        "url": "http://relay:8765",
        "key": "k1",
        "http_status": 200,
        "server_ms": 12.5,
        **dict.fromkeys(("results", "duplicates", "records", "tokens"), 0),
        "ms": {**{name: 1.5 for name in phases}, "total": 40.2},
    }
    start = 1_790_000_000
    with open(tmp_path / "outcomes.jsonl", "w") as fh:
        for i in range(60_000):
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(start + i))
            fh.write(json.dumps({"ts": stamp, **line}, separators=(",", ":")) + "\n")
    probe = (
        "import json, resource, sys\n"
        "from relay.hook import config\n"
        "from relay.hook_stats import summarise\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "summary = summarise(sys.argv[1], None, cfg=config.load({}))\n"
        "grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
        "print(json.dumps([summary['invocations'], grown // 1024]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    invocations, grown_mb = json.loads(done.stdout)
    assert invocations == 60_000
    assert grown_mb < 40, grown_mb
