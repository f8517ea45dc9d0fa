"""`relay eval replay` and `relay eval faults` on a small team dataset: the real hook, a real
server, the documented JSON, advice that the hook honours, and a report Chromium renders."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from eval_support import MEMORIES, SESSIONS, png_pixels, write_team_dataset
from hook_support import FakeRelay, Hook, assert_hit_contract, record, reply, results
from integration_support import relay

from relay.eval.advice import apply
from relay.eval.commands import eval_group
from relay.eval.conversations import (
    CLASSES,
    MEMORY_CLASSES,
    Turn,
    build_conversations,
    load_conversations,
    write_jsonl,
)
from relay.eval.faults import KINDS
from relay.eval.harness import Run
from relay.eval.replay import _Context, cumulative_by_turn, extras, figures, injected_records
from relay.eval.report import histogram, lines, targets
from relay.hook import config as hook_config
from relay.hook_bench import ON_TIME_SLACK_MS
from relay.knob_script import hook_script, read_file

R_KEYS = {
    "hook_ms",
    "outcomes",
    "tokens_per_turn",
    "tokens_cumulative",
    "duplicate_rate",
    "useful_rate",
    "quiet_rate",
}


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    return write_team_dataset(tmp_path_factory.mktemp("team") / "acme")


@pytest.fixture(scope="module")
def replayed(team, tmp_path_factory):
    out = tmp_path_factory.mktemp("replay")
    result = CliRunner().invoke(
        eval_group,
        ["replay", str(team), "--json", str(out / "figures.json"), "--report-dir", str(out)],
    )
    assert result.exit_code == 0, result.output
    return out, result.output


def test_replay_writes_exactly_the_documented_schema(replayed, team):
    out, text = replayed
    data = json.loads((out / "figures.json").read_text())
    assert set(data) == {"conversations", "turns", "on", "off", "ungated"}
    assert data["conversations"] == len(SESSIONS)
    assert data["turns"] == sum(len(t) for t in SESSIONS.values())
    for mode in ("on", "off", "ungated"):
        r = data[mode]
        assert set(r) == R_KEYS | {"by_class"}
        assert set(r["hook_ms"]) == {"p50", "p95", "p99"} and r["hook_ms"]["p50"] > 0
        assert sum(r["outcomes"].values()) == data["turns"]
        assert set(r["by_class"]) == set(CLASSES)
        for figures_of_class in r["by_class"].values():
            assert set(figures_of_class) == R_KEYS
    on, off, ungated = data["on"], data["off"], data["ungated"]
    assert off["outcomes"]["disabled"] == data["turns"] and off["tokens_cumulative"] == 0
    assert off["useful_rate"] == 0.0 and off["quiet_rate"] == 1.0
    assert on["duplicate_rate"] == 0.0
    assert on["outcomes"]["hit"] >= 1 and on["outcomes"]["skipped"] >= 1
    assert ungated["outcomes"]["skipped"] <= on["outcomes"]["skipped"]
    assert ungated["tokens_cumulative"] >= on["tokens_cumulative"] > 0
    assert "useful" in text
    # the advice names what it was fitted to (it said "this team's replay" of bench data too)
    assert f"advice (fitted to the 2 conversations replayed from {team}, 10 prompts" in text
    assert "this team's" not in text
    assert "predicted targets, current -> advised: usefulness ≥ 0.8 " in text


def test_replay_report_json_carries_turns_advice_and_the_commit(replayed):
    out, _ = replayed
    report = json.loads((out / "replay.json").read_text())
    assert report["figures"] == json.loads((out / "figures.json").read_text())
    assert report["meta"]["commit"]["head"] and report["meta"]["deadline_ms"] == 400
    rows = report["turns"]
    assert len(rows) == 3 * report["figures"]["turns"]
    # what the hook printed and what it logged agree on every turn
    assert all(m["inconsistent"] == 0 for m in report["extras"]["modes"].values())
    advice = report["advice"]
    assert set(advice["recommended"]) == {
        "min_prompt_len",
        "throttle_prompts",
        "overlap_threshold",
        "min_score",
        "max_records",
    }
    # the token target is read against the same ungated run the figures report
    assert advice["ungated_tokens_cumulative"] == report["figures"]["ungated"]["tokens_cumulative"]
    # the advised setting is judged by the targets the report judges the replay by
    assert advice["sample"] == {"conversations": 2, "memory_prompts": 10, "quiet_prompts": 10}
    for setting in ("current", "recommended"):
        checks, predicted = advice[f"targets_{setting}"], advice[f"predicted_{setting}"]
        assert set(checks) == {"useful_rate", "quiet_rate", "tokens_of_ungated"}
        assert checks["useful_rate"] == {
            "value": predicted["useful_rate"],
            "met": predicted["useful_rate"] >= 0.8,
        }
    if not advice["targets_recommended"]["useful_rate"]["met"]:
        assert "usefulness target" in advice["rule"]
    html = (out / "replay.html").read_text()
    assert "the advice below predicts them for the setting it advises" in html
    assert "<td>usefulness ≥ 0.8</td>" in html
    # the offline replay of the gate searches exactly where the real hook did
    on = [r for r in rows if r["mode"] == "on"]
    # (only where every turn ran normally: a hook starved of its stdin on a loaded machine
    # skips with `stdin_timeout`, which no replay of the gate can foresee)
    gated = ("short_prompt", "no_keywords", "throttled", "same_topic")
    if all(r["outcome"] in ("hit", "no_match") or r["reason"] in gated for r in on):
        for kind, share in advice["predicted_current"]["searched_by_class"].items():
            mine = [r for r in on if r["kind"] == kind]
            measured = sum(r["outcome"] != "skipped" for r in mine) / len(mine)
            assert share == pytest.approx(measured, abs=1e-3), kind
    assert (out / "conversations.jsonl").exists()


def test_a_late_turn_is_listed_with_the_hooks_own_phase_timings(replayed):
    out, _ = replayed
    report = json.loads((out / "replay.json").read_text())
    on = [r for r in report["turns"] if r["mode"] == "on"]
    assert all({"start", "stdin", "total"} <= set(r["hook_phases_ms"]) for r in on)
    # With no time allowed at all, every turn is late, and each is listed with where its
    # time went, as the hook's own log measured it.
    late = extras(report["turns"], -ON_TIME_SLACK_MS)["modes"]["on"]
    assert late["over_deadline"] == len(late["late_turns"]) == len(on)
    assert [t["hook_phases_ms"] for t in late["late_turns"]] == [r["hook_phases_ms"] for r in on]
    as_run = report["extras"]["modes"]["on"]
    assert as_run["over_deadline"] == len(as_run["late_turns"])


def test_report_renders_in_headless_chromium_with_every_plot_drawn(replayed, tmp_path):
    out, _ = replayed
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is missing: ./scripts/setup.sh --dev installs it"
    page = (out / "replay.html").as_uri()
    base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
    base += ["--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(
        [*base, "--dump-dom", page], capture_output=True, text=True, timeout=90
    ).stdout
    plots = {}
    for chunk in dom.split('<svg class="plot"')[1:]:
        name = chunk.split('data-plot="', 1)[1].split('"', 1)[0]
        marks = int(chunk.split('data-marks="', 1)[1].split('"', 1)[0])
        plots[name] = (marks, chunk.split("</svg>", 1)[0])
    assert set(plots) == {"latency", "outcomes", "tokens", "usefulness"}
    for name, (marks, svg) in plots.items():
        assert marks > 0, name
        assert "<rect" in svg or "<polyline" in svg, name
    assert plots["latency"][1].count('class="mark"') == 2  # the deadline and deadline + 50
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            *base,
            f"--screenshot={shot}",
            "--window-size=1000,2400",
            "--force-device-scale-factor=0.5",
            "--hide-scrollbars",
            page,
        ],
        capture_output=True,
        timeout=90,
    )
    width, height, rows = png_pixels(shot.read_bytes())
    step = 4 if len(rows[0]) == width * 4 else 3
    blue = orange = inked = 0
    for row in rows:
        for x in range(0, len(row), step):
            r, g, b = row[x], row[x + 1], row[x + 2]
            inked += r + g + b < 720
            blue += abs(r - 0x2F) < 24 and abs(g - 0x6F) < 24 and abs(b - 0xDF) < 24
            orange += abs(r - 0xE0) < 24 and abs(g - 0x83) < 24 and abs(b - 0x2F) < 24
    assert inked > 0.02 * width * height  # far from blank
    assert blue > 200 and orange > 200  # the 'on' and 'ungated' series were painted


def test_a_drill_run_that_waited_out_its_budget_is_logged_correctly_as_a_timeout():
    """QA: on a loaded machine the compaction drill counted two runs the hook logged as
    `timeout`, after 382 ms and 815 ms of a 400 ms budget, as mislogged (only hit, no_match
    or no request passed); the killed server's drill already took such a timeout as right."""
    from relay.eval.faults import _healthy_ok

    def timeout(ms: float, reason: str) -> Run:
        return Run(0, b"", ms, {"outcome": "timeout", "reason": reason})

    assert _healthy_ok(timeout(382.0, "network"), 400)
    assert _healthy_ok(timeout(815.0, "no_budget_left"), 400)
    assert not _healthy_ok(timeout(120.0, "network"), 400)  # no budget waited out: mislogged
    assert not _healthy_ok(Run(0, b"", 90.0, {"outcome": "hit"}), 400)  # a hit injected nothing


def test_every_drill_has_its_own_colour_in_the_latency_plot():
    """QA: the faults latency plot drew deletion in hung's blue, revocation in slow_body's
    orange and compaction in denied_key's green: six colours for nine lines."""
    svg = histogram({kind: [100.0 + i] for i, kind in enumerate(KINDS)}, [], "drills")
    strokes = re.findall(r'<polyline fill="none" stroke="([^"]+)"', svg)
    legend = re.findall(r'<rect x="[^"]+" y="6" width="12" height="12" fill="([^"]+)"', svg)
    assert len(strokes) == len(KINDS) == len(set(strokes))
    assert legend == strokes


def test_the_deadline_label_is_not_struck_through_by_the_line_50_ms_on():
    """QA: 'deadline 400 ms', written right of its line, ran across the +50 line."""
    svg = histogram({"on": [120.0]}, [(400.0, "deadline 400 ms"), (450.0, "+50")], "c")
    lines = [float(x) for x in re.findall(r'<line class="mark" x1="([0-9.]+)"', svg)]
    labels = re.findall(r'<text (text-anchor="end" )?x="([0-9.]+)"[^>]*#c62828">([^<]+)<', svg)
    assert [(bool(end), label) for end, _, label in labels] == [
        (True, "deadline 400 ms"),
        (False, "+50"),
    ]
    assert float(labels[0][1]) < lines[0] < lines[1] < float(labels[1][1])


def _round_ticks(labels: list[str], reaches: float) -> bool:
    """Labels 0, s, 2s, ... up to at least `reaches`, with s 1, 2, 2.5 or 5 x 10^k."""
    values = [float(x[:-1]) * 1000 if x.endswith("k") else float(x) for x in labels]
    step = values[1]
    mantissa = step / 10 ** math.floor(math.log10(step))
    return (
        all(math.isclose(v, i * step, abs_tol=1e-12) for i, v in enumerate(values))
        and min(abs(mantissa - m) for m in (1, 2, 2.5, 5)) < 1e-9
        and values[-1] >= reaches
    )


@pytest.mark.parametrize("top", [4700.0, 3750.0, 1250.0, 266.0, 0.37, 1.0, 12_345.0])
def test_axis_ticks_are_round_numbers_labelled_exactly(top):
    """QA: the tokens axis of a replay ran to 5000 in quarters, labelled '1.2k' for 1250
    and '3.8k' for 3750."""
    svg = lines({"on": [0.0, top / 2, top], "ungated": [top / 3]}, "tokens", "c", "tokens")
    y = re.findall(r'text-anchor="end">([^<]+)</text>', svg)
    assert _round_ticks(y, top), y
    svg = histogram({"on": [top]}, [], "c")
    x = [t[: -len(" ms")] for t in re.findall(r">([^<>]+ ms)</text>", svg)]
    assert _round_ticks(x, top * 1.05), x


def test_faults_drills_on_the_team_dataset(team, tmp_path):
    result = CliRunner().invoke(
        eval_group,
        ["faults", str(team), "--conversations", "1", "--drill-prompts", "2"]
        + ["--json", str(tmp_path / "figures.json"), "--report-dir", str(tmp_path / "rep")]
        + ["--workdir", str(tmp_path / "work")],
    )
    data = json.loads((tmp_path / "figures.json").read_text())
    assert list(data) == list(KINDS)
    details = json.loads((tmp_path / "rep" / "faults.json").read_text())["drills"]
    for kind, d in data.items():
        assert set(d) == {"turns", "on_time", "injected_from_failure", "logged_correctly"}
        assert d["turns"] > 0, kind
        assert d["injected_from_failure"] == 0, (kind, result.output)
        assert d["logged_correctly"] == d["turns"], (kind, result.output)
        # a loaded machine may push one run past deadline + 50 ms; BENCHMARKS.md has the figures
        assert d["on_time"] >= d["turns"] - 1, (kind, result.output)
    for kind in ("hung", "slow_body", "denied_key", "oversized", "invalid_json", "server_killed"):
        assert details[kind]["faulted_requests"] > 0, kind  # the fault reached the hook
    assert all(d["exercised"] for d in details.values()), details
    assert details["deletion"]["deleted"] > 0
    # QA: docs/eval.md's two-memory example folder failed the command ("some drill runs were
    # late, injected from a failure or mislogged", none was): deletion had deleted both
    # memories, and revocation, run after it, had nothing left to be served. Deletion last.
    logs = tmp_path / "work" / "homes"
    ts = {
        drill: sorted(
            json.loads(line)["ts"]
            for log in (logs / drill).rglob("outcomes.jsonl")
            for line in log.read_text().splitlines()
        )
        for drill in ("rev", "del")
    }
    assert ts["rev"] and ts["del"] and ts["rev"][-1] < ts["del"][0], ts
    html = (tmp_path / "rep" / "faults.html").read_text()
    assert 'data-plot="drills"' in html and 'data-plot="latency"' in html


@pytest.fixture(scope="module")
def team_server(tmp_path_factory):
    """A running `relay serve` holding the team's memories, as a team runs it."""
    from conftest import start_server
    from eval_support import MEMORIES

    server = start_server(tmp_path_factory.mktemp("team-server") / "relay.db")
    try:
        headers = {"Authorization": f"Bearer {server.admin_key}"}
        for mid, text in MEMORIES:  # every gold memory SESSIONS names (the replay checks)
            response = httpx.post(
                f"{server.url}/v1/memories", json={"id": mid, "body": text}, headers=headers
            )
            assert response.status_code == 201, response.text
        yield server
    finally:
        server.stop()
        if server.process.stdout:
            server.process.stdout.close()


def test_replay_of_a_teams_jsonl_against_its_own_server(team_server, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    rows = [
        {"prompt": p, "session": s, "turn": i, "kind": k, "relevant": g}
        for s, turns in SESSIONS.items()
        for i, (p, k, g) in enumerate(turns, 1)
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(
        eval_group,
        ["replay", str(prompts), "--url", team_server.url, "--key", team_server.admin_key]
        + ["--json", str(tmp_path / "f.json"), "--report-dir", str(tmp_path / "rep")],
    )
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "f.json").read_text())
    assert data["conversations"] == 2 and data["turns"] == len(rows)
    assert data["on"]["duplicate_rate"] == 0.0


def test_a_gold_memory_recall_can_never_bring_is_named_before_the_replay(team_server, tmp_path):
    """QA: a 'relevant' id mistyped (or of a memory deleted, superseded or expired) replayed
    without a word: its prompt could never be useful, and the figures and the advice fitted
    to them read that as recall missing it."""
    import time
    from datetime import UTC, datetime, timedelta

    headers = {"Authorization": f"Bearer {team_server.admin_key}"}
    # in the future when written (whole seconds, on a loaded machine), then waited past
    end = (datetime.now(UTC) + timedelta(seconds=3)).replace(microsecond=0)
    soon = end.isoformat()
    for memory in (
        {"id": "gold-ci-old", "body": "CI runs on Jenkins in the basement."},
        {"id": "gold-ci-new", "body": "CI runs on GitHub Actions.", "supersedes": ["gold-ci-old"]},
        {"id": "gold-freeze", "body": "Deploys are frozen this week.", "valid_until": soon},
    ):
        made = httpx.post(f"{team_server.url}/v1/memories", json=memory, headers=headers)
        assert made.status_code == 201, made.text
    time.sleep(max(0.0, (end - datetime.now(UTC)).total_seconds()) + 0.2)  # gold-freeze expired
    cases = {
        "team:migratoins": "which is no memory this key can read (mistyped, deleted, or for "
        "other audiences)",
        "gold-ci-old": "which gold-ci-new supersedes, so recall never returns it",
        "gold-freeze": f"which expired at {soon.replace('+00:00', 'Z')}, so recall never "
        "returns it",
    }
    prompts = tmp_path / "prompts.jsonl"
    before = _live_eval_keys(team_server)
    for gold, why in cases.items():
        rows = [
            {"prompt": "write a database migration by hand", "relevant": ["team:migrations"]},
            {"prompt": "which CI do we run the tests on?", "session": "a", "relevant": [gold]},
        ]
        prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
        done = relay(
            tmp_path,
            *("eval", "replay", str(prompts), "--url", team_server.url),
            *("--key", team_server.admin_key, "--report-dir", str(tmp_path / "rep")),
        )
        assert one_error_line(done) == (
            f"relay: error: {prompts}: the prompt 'which CI do we run the tests on?' names "
            f"{gold} in 'relevant', {why}: it could never count as useful"
        )
        assert done.returncode == 2
        assert not (tmp_path / "rep").exists()
    assert _live_eval_keys(team_server) == before  # the keys minted for the check, revoked


def test_json_goes_into_a_folder_made_for_it_and_one_it_cannot_be_written_to_is_refused_first(
    team_server, tmp_path
):
    """QA: --json naming a folder that did not exist replayed everything, wrote the report,
    then ended in a FileNotFoundError traceback, the figures lost."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "write a database migration by hand"}\n')
    args = ["eval", "replay", str(prompts), "--url", team_server.url]
    args += ["--key", team_server.admin_key, "--report-dir", str(tmp_path / "rep")]
    figures = tmp_path / "new" / "folder" / "figures.json"
    done = relay(tmp_path, *args, "--json", str(figures))
    assert done.returncode == 0, done.stderr
    assert json.loads(figures.read_text())["turns"] == 1
    (tmp_path / "file").write_text("")
    done = relay(
        tmp_path,
        *args[:-2],
        "--report-dir",
        str(tmp_path / "rep2"),
        "--json",
        str(tmp_path / "file" / "f.json"),
    )
    assert one_error_line(done) == (
        f"relay: error: --json {tmp_path / 'file' / 'f.json'} cannot be written: "
        f"{tmp_path / 'file'} is a file"
    )
    assert done.returncode == 2 and not (tmp_path / "rep2").exists()


def test_unlabelled_team_prompts_are_measured_but_not_advised_on(team_server, tmp_path):
    """QA: prompts without gold were scored as nothing_relevant, the advice raised min_score
    to 0.8 to silence them all, and --apply wrote it; a needs_memory row without relevant
    crashed the figures. Now: figures without rates, 'no advice', and --apply refused."""
    prompts = tmp_path / "min.jsonl"
    rows = [
        {
            "prompt": "write a database migration by hand for the orders table",
            "session": "a",
            "turn": 1,
            "kind": "needs_memory",
        },
        {"prompt": "which column type should hold the refund amount", "session": "a", "turn": 2},
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["replay", str(prompts), "--url", team_server.url, "--key", team_server.admin_key]
    args += ["--json", str(tmp_path / "f.json"), "--report-dir", str(tmp_path / "rep")]
    config = tmp_path / "config.json"
    env = {"RELAY_CONFIG": str(config)}
    applied = relay(tmp_path, "eval", *args, "--apply", **env)
    assert applied.returncode == 2 and applied.stdout == "", applied.stderr
    assert applied.stderr.startswith(
        "relay: error: --apply: no advice to apply: no prompt names the memories it needs"
    )
    assert not config.exists() and not (tmp_path / "rep").exists()  # stopped before replaying

    result = CliRunner().invoke(eval_group, args, env=env)
    assert result.exit_code == 0, result.output
    assert "no advice: no prompt names the memories it needs" in result.output
    data = json.loads((tmp_path / "f.json").read_text())
    assert data["turns"] == 2 and data["on"]["useful_rate"] is None
    assert set(data["on"]["by_class"]) == {"needs_memory", "unlabelled"}
    for mode in ("on", "off", "ungated"):  # in no rate, as documented (quiet_rate was 0.0)
        unlabelled = data[mode]["by_class"]["unlabelled"]
        assert unlabelled["useful_rate"] is None and unlabelled["quiet_rate"] is None
    report = json.loads((tmp_path / "rep" / "replay.json").read_text())
    assert set(report["advice"]) == {"refused", "current"}
    page = (tmp_path / "rep" / "replay.html").read_text()
    assert "No advice: no prompt names" in page
    # QA: the usefulness plot was drawn as an empty frame of axes, every rate read as 0
    assert 'data-plot="usefulness"' not in page and "No class has a rate to draw" in page
    assert not config.exists()


def one_error_line(done) -> str:  # noqa: ANN001
    """The one line `relay` printed on stderr for an error, as every command prints one."""
    assert done.returncode != 0 and done.stdout == "", (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    return done.stderr.rstrip("\n")


def test_a_refused_key_or_a_server_down_stops_the_replay_at_once(team_server, tmp_path):
    """QA: a wrong key gave exit 0 and a full report of 'unauthorized' turns that looked
    quiet; a server down ran the whole replay, then a ConnectionRefusedError traceback."""
    from conftest import free_port

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "write a database migration by hand", "kind": "follow_up"}\n')
    down = f"http://127.0.0.1:{free_port()}"
    cases = [
        (team_server.url, "relay_abc_def", 3, f"{team_server.url} refused the key: "),
        (down, team_server.admin_key, 8, f"cannot reach the Relay server at {down}: "),
    ]
    for url, key, code, expected in cases:
        done = relay(
            tmp_path,
            *("eval", "replay", str(prompts), "--url", url, "--key", key),
            *("--report-dir", str(tmp_path / "rep")),
        )
        assert one_error_line(done).startswith(f"relay: error: {expected}"), done.stderr
        assert done.returncode == code
        assert not (tmp_path / "rep").exists()


def test_a_server_lost_part_of_the_way_in_stops_the_replay_without_advice(tmp_path):
    """QA: a server killed part of the way into a team's replay (or restarted before the
    advice's searches) left exit 0 and the outage's figures: its failed turns read as quiet
    and not useful, and the advice, fitted to them, was applied. Now the report keeps what
    happened, the advice is refused, and the command fails in one line naming the outage."""
    from conftest import start_server
    from integration_support import RELAY, clean_env

    server = start_server(tmp_path / "relay.db")
    prompts = tmp_path / "prompts.jsonl"
    rows = [
        {"prompt": f"how do we write database migration number {i} by hand", "session": "a"}
        for i in range(8)
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["eval", "replay", str(prompts), "--url", server.url, "--key", server.admin_key]
    done = subprocess.Popen(
        [RELAY, *args, "--report-dir", str(tmp_path / "rep")],
        env=clean_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert done.stderr is not None
        for line in done.stderr:  # the check before the replay has passed: kill it now
            if line.startswith("replaying "):
                break
        server.process.kill()
        out, err = done.communicate(timeout=120)
    finally:
        done.kill()
        server.stop()
    assert done.returncode == 1, (out, err)
    line = err.rstrip("\n").rsplit("\n", 1)[-1]
    assert line.startswith(f"relay: error: {server.url}: "), err
    assert "hook runs that search got no answer from the server (unavailable " in line, line
    assert "circuit_open" in line and "not recall" in line, line
    report = json.loads((tmp_path / "rep" / "replay.json").read_text())
    assert report["advice"]["refused"] in line
    assert report["figures"]["on"]["outcomes"]["unavailable"] > 0
    assert "no advice: " in out and "got no answer from the server" in out
    # ... and the report's cards judge no target on an outage's figures (QA: they said met)
    page = (tmp_path / "rep" / "replay.html").read_text()
    cards = page.split('<div class="cards">', 1)[1].split("</div></div>", 1)[0]
    assert cards.count("not measured") == 5 and ">met<" not in cards and "not met" not in cards
    assert "hook runs got no answer from the server (it stopped answering part of" in page


def test_a_key_that_cannot_read_is_refused_with_a_command_that_makes_one(team_server, tmp_path):
    """QA: the hint 'create one with relay key create --scope memory:read' failed as written
    (the command needs --org and --name)."""
    import shlex

    made = relay(
        *(tmp_path, "key", "create", "--org", "acme", "--name", "writer"),
        *("--scope", "memory:write"),
        RELAY_DB=str(team_server.db),
    )
    assert made.returncode == 0, made.stderr
    writer = made.stdout.split("secret (shown once): ", 1)[1].strip()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "write a database migration by hand"}\n')
    done = relay(
        tmp_path, "eval", "replay", str(prompts), "--url", team_server.url, "--key", writer
    )
    line = one_error_line(done)
    assert line.startswith("relay: error: the key ") and "lacks memory:read" in line, line
    assert done.returncode == 3
    hint = shlex.split(line.rsplit(" with '", 1)[1].rstrip("'"))
    assert hint[0] == "relay"
    made = relay(tmp_path, *hint[1:], RELAY_DB=str(team_server.db))  # run where the database is
    assert made.returncode == 0, made.stderr
    reader = made.stdout.split("secret (shown once): ", 1)[1].strip()
    who = httpx.get(f"{team_server.url}/v1/whoami", headers={"Authorization": f"Bearer {reader}"})
    assert who.status_code == 200 and "memory:read" in who.json()["key"]["scopes"]


def test_a_teams_prompts_replay_against_the_server_every_client_command_uses(
    team_server, team, tmp_path
):
    """QA: 'relay eval replay team.jsonl' refused with 'needs --url and --key' although
    RELAY_URL/RELAY_API_KEY were set and relay install had written ~/.relay/config.json,
    which every other client command falls back to; and a bench folder took --url/--key
    and silently replayed against a server of its own instead."""
    from conftest import free_port

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "write a database migration by hand", "kind": "follow_up"}\n')
    down = f"http://127.0.0.1:{free_port()}"
    replay = ("eval", "replay", str(prompts), "--report-dir", str(tmp_path / "rep"))
    # nothing configured: the same line as every client command
    done = relay(tmp_path / "nobody", *replay)
    assert one_error_line(done) == (
        "relay: error: no server URL: pass --url, set RELAY_URL, or run 'relay install'"
    )
    # the environment: the replay asks that server, with that key
    done = relay(tmp_path, *replay, RELAY_URL=team_server.url, RELAY_API_KEY="relay_abc_def")
    assert one_error_line(done).startswith(f"relay: error: {team_server.url} refused the key")
    done = relay(tmp_path, *replay, RELAY_URL=down, RELAY_API_KEY=team_server.admin_key)
    assert one_error_line(done).startswith(f"relay: error: cannot reach the Relay server at {down}")
    # a key file, off the command line, as every client command takes it
    key_file = tmp_path / "wrong.key"
    key_file.write_text("relay_abc_def\n")
    done = relay(tmp_path, *replay, "--url", team_server.url, "--key-file", str(key_file))
    assert one_error_line(done).startswith(f"relay: error: {team_server.url} refused the key")
    done = relay(tmp_path, *replay, "--key-file", str(key_file), RELAY_URL=down)
    assert one_error_line(done).startswith(f"relay: error: cannot reach the Relay server at {down}")
    # the config relay install writes (its key in a file beside it)
    home = tmp_path / "home"
    (home / ".relay").mkdir(parents=True)
    (home / ".relay" / "key").write_text(team_server.admin_key + "\n")
    (home / ".relay" / "config.json").write_text(
        json.dumps({"url": team_server.url, "api_key_file": str(home / ".relay" / "key")})
    )
    done = relay(home, *replay, "--json", str(tmp_path / "f.json"))
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "f.json").read_text())["turns"] == 1
    # flags still come first, and the installed key goes to the installed server only
    done = relay(home, *replay, "--url", down)
    assert one_error_line(done).startswith(
        f"relay: error: {down} is not the server this machine's key is for"
    )
    done = relay(home, *replay, "--url", down, "--key", team_server.admin_key)
    assert one_error_line(done).startswith(f"relay: error: cannot reach the Relay server at {down}")

    bench = CliRunner().invoke(
        eval_group,
        ["replay", str(team), "--url", team_server.url, "--key", "k"]
        + ["--report-dir", str(tmp_path / "bench")],
    )
    assert bench.exit_code == 2, bench.output
    assert "--url and --key are for a JSONL of prompts" in bench.output
    assert not (tmp_path / "bench").exists()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{bad", " is not valid JSON (line 1 column 2: Expecting property name"),
        ("[1]", " is JSON but not an object of settings: fix the file"),
        # QA: json.loads took NaN, which the hook refuses, ignoring the whole file
        ('{"min_prompt_len": 30, "min_score": NaN}', " is not valid JSON (NaN is not JSON)"),
        ('{"url": "http://x", "min_score": 2}', ": the hook would ignore min_score 2 in "),
        ('{"throttle_prompts": "often"}', ": the hook would ignore throttle_prompts 'often' in "),
        ('{"min_scor": 0.3}', ": the hook would ignore min_scor (not a setting; did you mean "),
        (  # QA: a user's own key, which --apply keeps, is told how to stay (a comment)
            '{"colour": "blue"}',
            ": the hook would ignore colour (not a setting; docs/hook.md lists them; a note of"
            " your own: name it _colour)",
        ),
    ],
)
def test_a_config_the_hook_could_not_read_is_an_error(team, tmp_path, text, expected):
    """QA: --config '{bad' was silently ignored (the hook falls back to its defaults), so the
    replay measured the defaults under the file's name; so was a misspelt knob."""
    config = tmp_path / "config.json"
    config.write_text(text)
    done = relay(
        tmp_path,
        *("eval", "replay", str(team), "--config", str(config)),
        *("--report-dir", str(tmp_path / "rep")),
    )
    assert one_error_line(done).startswith(f"relay: error: --config {config}{expected}")
    assert done.returncode == 2


def test_a_config_saved_with_a_byte_order_mark_is_replayed_as_the_hook_reads_it(
    team_server, tmp_path
):
    """QA: --config refused a config.json Notepad saved ('Unexpected UTF-8 BOM'), which the
    hook and --apply read, as `relay doctor` does."""
    config = tmp_path / "config.json"
    config.write_bytes(b"\xef\xbb\xbf" + b'{"min_prompt_len": 30, "max_records": 2}\n')
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "write a database migration by hand"}\n')
    result = CliRunner().invoke(
        eval_group,
        ["replay", str(prompts), "--url", team_server.url, "--key", team_server.admin_key]
        + ["--config", str(config), "--report-dir", str(tmp_path / "rep")],
    )
    assert result.exit_code == 0, result.output
    knobs = json.loads((tmp_path / "rep" / "replay.json").read_text())["meta"]["knobs"]
    assert knobs["min_prompt_len"] == 30 and knobs["max_records"] == 2


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (['{"prompt": "write a migration"}', "{bad"], "line 2: not JSON"),
        (['{"prompt": "write a migration"}', "", '["a"]'], "line 3: not a JSON object"),
        (  # QA: json.dump(rows, indent=1) said 'line 1: not JSON (Expecting value at column 2)'
            ["[", ' {"prompt": "write a migration"}', "]"],
            "line 1: a JSON array; a prompts file is JSONL, one JSON object a line",
        ),
        (['{"prompt": "fix it", "relevant": "team:x"}'], "line 1: 'relevant' is not a list"),
        (['{"prompt": "a", "session": "s", "turn": "2"}'], "line 1: 'turn' is not a whole"),
        (['{"query": ""}'], "line 1: no prompt"),
        (['{"query":"x"'], "line 1: not JSON (Expecting ',' delimiter at column 13)"),
        (
            ['{"prompt": "a b", "kind": "needs_memory", "relevant": ["m"]}']
            + ['{"prompt": "explain CMD", "kind": "nothing_relevant", "relevant": ["m"]}'],
            "line 2: a nothing_relevant prompt lists 'relevant' memories, but it should get "
            "nothing: give it kind needs_memory, or drop 'relevant'",
        ),
        (
            ['{"prompt": "go on", "kind": "follow_up", "relevant": ["m"]}'],
            "line 1: a follow_up prompt lists 'relevant' memories",
        ),
    ],
)
def test_a_bad_row_in_a_prompts_jsonl_is_one_line_naming_its_line(tmp_path, lines, expected):
    """QA: an array row raised AttributeError; a bad JSON on line 2 said 'line 1 column 2';
    '{"query":"x"' said 'at column 1', the line break taken for a second line."""
    prompts = tmp_path / "bad.jsonl"
    prompts.write_text("\n".join(lines) + "\n")
    done = relay(
        tmp_path, "eval", "replay", str(prompts), "--url", "http://127.0.0.1:9", "--key", "k"
    )
    assert one_error_line(done).startswith(f"relay: error: {prompts}: {expected}")
    assert done.returncode == 2


def test_a_prompts_jsonl_opening_with_a_byte_order_mark_is_read(tmp_path):
    """QA: a prompts file saved by a Windows editor or PowerShell (UTF-8 with a byte-order
    mark), which relay import and relay restore read, was refused: 'line 1: not JSON
    (Unexpected UTF-8 BOM (decode using utf-8-sig) at column 1)'."""
    prompts = tmp_path / "bom.jsonl"
    rows = ['{"prompt": "write a database migration by hand", "session": "a", "turn": 1}']
    rows += ['{"prompt": "ok, do it", "session": "a", "turn": 2, "kind": "follow_up"}']
    prompts.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(rows).encode() + b"\r\n")
    (conversation,) = load_conversations(prompts, None, 0, 20)
    assert [t.prompt for t in conversation.turns] == [
        "write a database migration by hand",
        "ok, do it",
    ]
    assert [t.kind for t in conversation.turns] == ["unlabelled", "follow_up"]
    prompts.write_bytes(b"\xef\xbb\xbf" + "\n\xef\xbb\xbf".join(rows).encode())
    with pytest.raises(ValueError, match="line 2: not JSON"):  # a mark inside is no row's
        load_conversations(prompts, None, 0, 20)


def test_a_teams_prompts_replay_as_written_with_their_own_classes(tmp_path):
    """QA: a sessionless JSONL of one prompt became a 20-turn conversation repeating it ten
    times, its explicit needs_memory rewritten to nothing_relevant; prompts with sessions
    and no kind were all classed nothing_relevant, and the advice fitted to that guess."""
    prompts = tmp_path / "prompts.jsonl"
    rows = [
        {"prompt": "write a database migration for orders", "kind": "needs_memory"},
        {"prompt": "ok, do it", "session": "a", "turn": 2},
        {"prompt": "which cluster do load tests use", "session": "a", "turn": 1},
        {"prompt": "add the charge endpoint", "session": "a", "turn": 3, "relevant": ["m1"]},
        {"prompt": "explain CMD versus ENTRYPOINT"},
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    conversations = load_conversations(prompts, None, seed=0)
    assert [[(t.prompt, t.kind) for t in c.turns] for c in conversations] == [
        [
            ("which cluster do load tests use", "unlabelled"),
            ("ok, do it", "unlabelled"),
            ("add the charge endpoint", "needs_memory"),
        ],
        [("write a database migration for orders", "needs_memory")],
        [("explain CMD versus ENTRYPOINT", "unlabelled")],
    ]
    assert [c.turns[0].relevant for c in conversations] == [(), (), ()]
    assert len(load_conversations(prompts, 2, seed=0)) == 2
    prompts.write_text('{"prompt": "fix the flaky test", "kind": "needs-memory"}\n')
    with pytest.raises(ValueError, match="line 1: kind 'needs-memory' is not one of"):
        load_conversations(prompts, None, seed=0)


def _locomo_like() -> list[dict]:
    rows = []
    for store in ("conv-a", "conv-b"):
        for s in range(1, 6):
            for q in range(4):
                gold = [f"S{s}:A:{q}", f"S{s}:A:{q + 1}"][: 1 + q % 2]
                rows.append(
                    {
                        "store": store,
                        "qid": f"{store}:S{s}:q{q}",
                        "query": f"question {q} about session {s} of {store}?",
                        "relevant": gold,
                        "answerable": True,
                        "kind": "single-hop",
                        "meta": {"answer": f"answer {s}.{q}"},
                    }
                )
        for n in range(6):
            rows.append(
                {
                    "store": store,
                    "qid": f"{store}:x{n}",
                    "query": f"what about the other person {n}?",
                    "relevant": [],
                    "answerable": False,
                    "kind": "adversarial",
                    "meta": {},
                }
            )
    return rows


def test_the_conversations_a_replay_lists_replay_again_as_the_same_conversations(tmp_path):
    """QA: conversations.jsonl, written 'for inspection and reuse', named each turn's
    conversation but no session, so given back to `relay eval replay` its 4 conversations of
    a team's prompts came back as 30 of one turn each (cumulative tokens 2220 -> 74)."""

    def shape(conversations: list) -> list:  # in the order of their ids, as sessions replay
        return sorted(
            (c.id, c.store, [(t.no, t.prompt, t.kind, t.relevant, t.answer) for t in c.turns])
            for c in conversations
        )

    prompts = tmp_path / "prompts.jsonl"
    rows = [
        {"prompt": p, "session": s, "turn": i, "kind": k, "relevant": g}
        for s, turns in SESSIONS.items()
        for i, (p, k, g) in enumerate(turns, 1)
    ]
    rows.append({"prompt": "explain CMD versus ENTRYPOINT"})  # a conversation of its own
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    built = build_conversations(_locomo_like(), 2, seed=0, turns=12)
    for conversations in (load_conversations(prompts, None, seed=0), built):
        listed = tmp_path / "conversations.jsonl"
        write_jsonl(listed, conversations)
        assert shape(load_conversations(listed, None, seed=0)) == shape(conversations)


def test_built_conversations_are_reproducible_and_mix_every_class():
    rows = _locomo_like()
    first = build_conversations(rows, 4, seed=3)
    assert first == build_conversations(rows, 4, seed=3)
    assert first != build_conversations(rows, 4, seed=4)
    assert [len(c.turns) for c in first] == [20, 20, 20, 20]
    assert {c.store for c in first} == {"conv-a", "conv-b"}
    for conv in first:
        assert {t.kind for t in conv.turns} == set(CLASSES)
        seen: set[str] = set()
        asked: list[set[str]] = []
        for turn in conv.turns:
            gold = set(turn.relevant)
            if turn.kind in MEMORY_CLASSES:
                assert gold and not gold & seen  # a new memory each time
                seen |= gold
                asked.append(gold)
            elif turn.kind == "same_topic":
                assert any(gold <= earlier for earlier in asked)
            else:
                assert not gold


def test_replay_counts_a_passage_shown_again_as_a_duplicate_and_another_passage_as_new(tmp_path):
    """What the model saw, read from the real hook's stdout: a long memory's passage 21 after
    its passage 0 is new text, not a duplicate; passage 0 again, with no compaction between
    (the ungated mode's fresh ledger lets it through), is one."""
    answer: dict = {}

    def handler(conn, request):
        reply(200, results(record("mem_long", **answer)))(conn, request)

    prompt = "what does the operations handbook say about failover drills?"
    context, rows, outs = _Context(), [], []
    with FakeRelay(handler) as server:
        hook = Hook(tmp_path, server.url, RELAY_THROTTLE_PROMPTS="0", RELAY_OVERLAP_THRESHOLD="1.5")
        for no, seq in enumerate((0, 21), 1):
            # each passage its own text, as a long memory's are (the same text again under
            # another passage would be a duplicate to the hook, which keys what it showed by it)
            text = f"Passage {seq} of the operations handbook on failover drills."
            answer.update(revision=1, passage=seq, passages=22, text=text)
            run = hook.prompt(prompt)
            outs.append(run.out)
            turn = Turn("c", no, prompt, "needs_memory", ("mem_long",))
            rows.append(context.account(turn, "on", Run(run.rc, run.out, run.ms, hook.last()), 3))
    assert [r["injected"] for r in rows] == [[["mem_long", 1, 0]], [["mem_long", 1, 21]]]
    assert [r["duplicates"] for r in rows] == [0, 0]
    turn = Turn("c", 3, prompt, "needs_memory", ("mem_long",))
    again = context.account(turn, "ungated", Run(0, outs[0], 1.0, {"outcome": "hit"}), 3)
    assert again["duplicates"] == 1
    assert figures([*rows, again], conversations=1)["duplicate_rate"] == 0.3333
    # a label with no part (a memory of one passage, the team profile) is passage 0
    assert injected_records('<relay-memory id="a" revision="2" source="s">') == [("a", 2, 0)]


def test_a_record_shown_cut_then_whole_is_no_duplicate():
    """Reviewer: the hook keeps a record shown cut out of its ledger, so it may come back
    whole; the replay counted that return as a duplicate."""

    def hook_out(context: str) -> bytes:
        return json.dumps({"hookSpecificOutput": {"additionalContext": context}}).encode()

    label = '<relay-memory id="a" revision="1" part="2 of 3" source="s" updated="d">\n'
    cut = Run(0, hook_out(label + "Step one [truncated]\n</relay-memory>"), 1.0, {})
    whole = Run(0, hook_out(label + "Step one, then two.\n</relay-memory>"), 1.0, {})
    context = _Context()
    rows = [
        context.account(Turn("c", no, "p", "needs_memory", ("a",)), "on", run, 3)
        for no, run in enumerate((cut, whole, whole), 1)
    ]
    assert [r["duplicates"] for r in rows] == [0, 0, 1]


def test_figures_count_duplicates_and_tokens_kept_in_history():
    def row(turn: int, tokens: int, records: int, dupes: int, kind: str = "needs_memory") -> dict:
        return {
            "conversation": "c",
            "turn": turn,
            "turns": 3,
            "kind": kind,
            "outcome": "hit" if tokens else "skipped",
            "ms": 10.0 * turn,
            "tokens": tokens,
            "records": records,
            "duplicates": dupes,
            "useful": turn == 1 if kind == "needs_memory" else None,
            "quiet": not tokens,
        }

    rows = [row(1, 100, 2, 0), row(2, 100, 2, 1), row(3, 0, 0, 0, "follow_up")]
    r = figures(rows, conversations=1)
    assert r["tokens_cumulative"] == 100 * 3 + 100 * 2  # each token stays for the rest
    assert r["tokens_per_turn"] == pytest.approx(200 / 3, abs=0.01)
    assert r["duplicate_rate"] == 0.25
    assert r["useful_rate"] == 0.5 and r["quiet_rate"] == 1.0
    assert r["by_class"]["follow_up"]["tokens_cumulative"] == 0
    assert r["by_class"]["needs_memory"]["tokens_cumulative"] == 500


def test_a_memory_prompt_without_gold_is_not_measured_for_usefulness():
    """QA: a team row with `kind` but no `relevant` ran the whole replay, then crashed in the
    figures (int + None); its usefulness is unknown, so it is left out, and null if alone."""

    def row(turn: int, kind: str, useful: bool | None) -> dict:
        return {
            "conversation": "c",
            "turn": turn,
            "turns": 2,
            "kind": kind,
            "outcome": "hit",
            "ms": 10.0,
            "tokens": 50,
            "records": 1,
            "duplicates": 0,
            "useful": useful,
            "quiet": False,
        }

    unlabelled = figures([row(1, "needs_memory", None)], conversations=1)
    # a row nobody labelled is in no rate at all, quiet or not
    alone = figures([{**row(1, "unlabelled", None), "quiet": True}], conversations=1)
    assert alone["by_class"]["unlabelled"]["quiet_rate"] is None
    assert alone["quiet_rate"] is None and alone["useful_rate"] is None
    assert unlabelled["useful_rate"] is None
    assert unlabelled["by_class"]["needs_memory"]["useful_rate"] is None
    mixed = figures([row(1, "needs_memory", None), row(2, "topic_shift", True)], 1)
    assert mixed["useful_rate"] == 1.0
    result = {"on": unlabelled, "ungated": unlabelled}
    more = {"modes": {"on": {"over_deadline": 0}}}
    verdicts = {name: ok for name, _, ok in targets(result, more)}
    assert verdicts["usefulness ≥ 0.8 on memory-needing prompts"] is None  # not "not met"


def test_apply_also_sets_the_installed_scripts_knobs_which_beat_the_config(tmp_path):
    """QA: --apply wrote min_prompt_len, throttle_prompts and overlap_threshold into the
    config, and the installed script, whose values win, went on exporting its own."""
    script = tmp_path / ".relay" / "relay-autosearch-hook.sh"
    script.parent.mkdir()
    script.write_text(hook_script("/usr/bin/relay-hook"))
    script.chmod(0o700)
    config = tmp_path / ".relay" / "config.json"
    advised = {"min_prompt_len": 20, "throttle_prompts": 0, "overlap_threshold": 0.2}
    written = apply({**advised, "min_score": 0.6}, {"RELAY_CONFIG": str(config)})
    assert written == [config, script]
    text = script.read_text()
    assert "MIN_PROMPT_LEN=20\n" in text and "THROTTLE_PROMPTS=0\n" in text
    assert "OVERLAP_THRESHOLD=0.20\n" in text and "DEADLINE_MS=400\n" in text
    assert script.stat().st_mode & 0o777 == 0o700
    done = subprocess.run(["sh", "-n", str(script)], capture_output=True)
    assert done.returncode == 0, done.stderr  # still a valid script
    # What the hook reads when the agents run it through the script (config.json beneath it).
    cfg = hook_config.load(read_file(script).handed({"RELAY_CONFIG": str(config)}))
    assert {k: cfg[k] for k in advised} == advised and cfg.min_score == 0.6


def test_apply_merges_the_advice_into_the_config_and_the_hook_honours_min_score(tmp_path):
    config = tmp_path / "relay" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"url": "http://relay.internal:8765", "throttle_prompts": 2}))
    config.chmod(0o640)
    written = apply({"min_score": 0.5, "throttle_prompts": 0}, {"RELAY_CONFIG": str(config)})
    assert written == [config]  # no hook script beside it: the config alone
    assert json.loads(config.read_text()) == {
        "url": "http://relay.internal:8765",
        "throttle_prompts": 0,
        "min_score": 0.5,
    }
    assert config.stat().st_mode & 0o777 == 0o640  # the user's file keeps its permissions
    new = tmp_path / "new" / "config.json"
    assert apply({"min_score": 0.5}, {"RELAY_CONFIG": str(new)}) == [new]
    assert new.stat().st_mode & 0o777 == 0o600  # a new one is its owner's alone
    answer = results(record("mem_good", score=0.9), record("mem_weak", score=0.2))
    with FakeRelay(reply(200, answer)) as server:
        settings = json.loads(config.read_text())
        settings["url"] = server.url
        config.write_text(json.dumps(settings))
        hook = Hook(tmp_path / "home", None, RELAY_CONFIG=str(config))
        hook.env["RELAY_API_KEY"] = "relay_test_0123456789abcdef"
        context = assert_hit_contract(hook.prompt("how do we write a database migration?"))
    assert 'id="mem_good"' in context and "mem_weak" not in context


def test_the_replay_takes_only_deadlines_the_hook_accepts(tmp_path):
    """A deadline the hook would ignore (under its least) must not be replayed as if used.
    QA: `relay bench hook --deadline-ms 60` took 60, the hook ran at its default 400, and
    the fault drill judged those runs by 60 ms: seven of eleven faults "not ok"."""
    from click.testing import CliRunner

    from relay.cli import cli
    from relay.hook.config import DEADLINE_MIN_MS

    for command in (["eval", "replay", str(tmp_path)], ["eval", "faults", str(tmp_path)]):
        done = CliRunner().invoke(cli, [*command, "--deadline-ms", str(DEADLINE_MIN_MS - 1)])
        assert done.exit_code == 2 and "--deadline-ms" in done.output, done.output
    done = CliRunner().invoke(cli, ["bench", "hook", "--deadline-ms", str(DEADLINE_MIN_MS - 1)])
    assert done.exit_code == 2 and "--deadline-ms" in done.output, done.output


def test_a_kept_database_is_reused_for_the_same_data_only_and_with_its_keys(tmp_path):
    """QA: after a memory's text changed in memories.jsonl, a replay with the same --workdir
    said 'loading ... into a fresh database', then 'reusing the database loaded from ...',
    and measured the old memories (the check compared the folder's path); and every reuse
    minted a new key per mode and store."""
    from relay.eval.harness import load_database
    from relay.store.sqlite import SQLiteStore

    folder = write_team_dataset(tmp_path / "acme")
    db = tmp_path / "work" / "relay.db"
    db.parent.mkdir()
    said: list[str] = []

    def load() -> dict:
        said.clear()
        return load_database(db, folder, None, ("on", "off"), said.append, reuse=True)

    def held() -> tuple[str, int]:
        store = SQLiteStore(db)
        try:
            org = store.find_org("acme")
            assert org is not None
            memory = store.current_memory(org.id, "team:migrations")
            assert memory is not None
            return memory.body, len(store.list_keys(org.id))
        finally:
            store.close()

    first = load()
    assert (
        said[0]
        == f"loading {folder} into a fresh database in {db.parent} (no replay loaded one there)"
    )
    body, keys = held()
    assert body == MEMORIES[0][1]
    assert load() == first  # the same keys, still valid
    assert said == [f"reusing the database in {db.parent}, loaded from the same data"]
    assert held() == (body, keys)  # nothing minted

    rows = (folder / "memories.jsonl").read_text().splitlines()
    changed = json.loads(rows[0])
    changed["text"] = "Database migrations are generated with Alembic autogenerate now."
    (folder / "memories.jsonl").write_text("\n".join([json.dumps(changed), *rows[1:]]) + "\n")
    assert load() != first
    assert said[0] == (
        f"loading {folder} into a fresh database in {db.parent} (its memories.jsonl changed)"
    )
    assert not any(line.startswith("reusing") for line in said)
    assert held()[0] == changed["text"]


def test_apply_with_another_config_is_refused(team, tmp_path):
    """QA: --config FILE --apply fitted the advice to FILE's knobs (min_score 0.2, kept) and
    merged its changes into ~/.relay/config.json, whose min_score 0.5 stayed: a setting the
    replay never measured, announced as applied."""
    config, other = tmp_path / "config.json", tmp_path / "other.json"
    config.write_text('{"min_score": 0.5}')
    other.write_text('{"min_score": 0.2}')
    done = relay(
        tmp_path,
        *("eval", "replay", str(team), "--config", str(other), "--apply"),
        *("--report-dir", str(tmp_path / "rep")),
        RELAY_CONFIG=str(config),
    )
    assert one_error_line(done) == (
        "relay: error: --apply fits the advice to the knobs the hook runs with now and writes "
        "its changes there, and --config replays other knobs: give one or the other (see "
        "'relay eval replay --help')"
    )
    assert done.returncode == 2 and not (tmp_path / "rep").exists()
    assert json.loads(config.read_text()) == {"min_score": 0.5}


def test_faults_on_a_folder_too_small_to_drill_say_which_drills_tested_nothing(tmp_path):
    """QA: on a tiny folder the deletion drill ran no prompt, and the command blamed "some
    drill runs were late, injected from a failure or mislogged" (none was); fault drills
    "passed" with faulted_requests 0, their fault never reaching the hook (the proxy's
    every-other-request count ran on across drills, so a drill making one request could
    find it forwarded). Each drill's first request is faulted now; a drill that tested
    nothing fails the command, named, with what would give it something to test."""
    folder = tmp_path / "tiny"
    folder.mkdir()  # one memory too short for the hook to search by its text, one prompt
    (folder / "memories.jsonl").write_text(
        '{"store": "shop", "id": "shop:tabs", "text": "Use tabs."}\n'
    )
    (folder / "queries.jsonl").write_text(
        '{"store": "shop", "qid": "shop:1", "query": "what is the weather like on the moon'
        ' today", "relevant": [], "kind": "nothing_relevant", "meta": {"session": "a"}}\n'
    )
    done = relay(tmp_path, "eval", "faults", str(folder), "--report-dir", str(tmp_path / "r"))
    assert done.returncode == 1, done.stderr
    error = done.stderr.splitlines()[-1]
    assert error.startswith("relay: error: not every drill passed: server_killed was not"), error
    assert "late" not in error and "mislogged" not in error, error
    assert "; deletion ran no prompts: " in error and "raise --drill-prompts" in error, error
    assert "; revocation was not exercised: " in error, error
    details = json.loads((tmp_path / "r" / "faults.json").read_text())["drills"]
    assert {kind: d["exercised"] for kind, d in details.items()} == {
        **dict.fromkeys(KINDS, True),
        "server_killed": False,
        "deletion": False,
        "revocation": False,
    }
    for kind in ("hung", "slow_body", "denied_key", "oversized", "invalid_json"):
        assert details[kind]["faulted_requests"] == 1, kind
    assert "exercised False" in (tmp_path / "r" / "faults.html").read_text()


def test_faults_given_a_teams_prompts_file_says_what_it_needs(tmp_path):
    """QA: `relay eval faults prompts.jsonl` said only "Directory 'prompts.jsonl' is a file"."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "write a database migration by hand"}\n')
    done = relay(tmp_path, "eval", "faults", str(prompts), "--report-dir", str(tmp_path / "r"))
    assert one_error_line(done) == (
        f"relay: error: {prompts} is a file: the drills need a bench-format folder "
        "(memories.jsonl and queries.jsonl: docs/eval.md), loaded into a server of their own "
        "that they kill and restart; a JSONL of prompts replays against its server with relay "
        "eval replay (see 'relay eval faults --help')"
    )
    assert done.returncode == 2 and not (tmp_path / "r").exists()


def test_each_command_says_what_it_does_with_a_database_in_its_workdir():
    """QA: `relay eval faults --help` said it reused a database it loaded in --workdir (the
    replay's text, shared), while the drills always load afresh."""

    def workdir_help(command: str) -> str:
        text = CliRunner().invoke(eval_group, [command, "--help"], terminal_width=400).output
        return " ".join(text.split("--workdir DIRECTORY", 1)[1].split("--help", 1)[0].split())

    assert "reuses a database it loaded there" in workdir_help("replay")
    faults = workdir_help("faults")
    assert "always load a fresh database" in faults and "reuse" not in faults, faults


def test_apply_starts_from_the_users_knobs_and_writes_only_its_changes_through_a_symlink(
    team, tmp_path
):
    """QA: with RELAY_CONFIG a symlink to a 0640 config holding max_records 2, --apply printed
    two changes against the defaults, wrote all five advised knobs (max_records 2 -> 3,
    unannounced), and replaced the link by a 0600 file; an unreadable config ran the whole
    replay and then died with a JSONDecodeError traceback."""
    cfgs = tmp_path / "cfgs"
    cfgs.mkdir()
    real, link = cfgs / "real.json", cfgs / "link.json"
    link.symlink_to(real.name)
    args = ("eval", "replay", str(team), "--apply", "--report-dir", str(tmp_path / "rep"))

    real.write_text('{"url": "x",}')  # not JSON: refused before anything is replayed
    done = relay(tmp_path, *args, RELAY_CONFIG=str(link))
    line = one_error_line(done)
    assert line.startswith(f"relay: error: --apply: {link} is not valid JSON (line 1"), line
    assert done.returncode == 2 and not (tmp_path / "rep").exists()

    mine = {"url": "http://relay.internal:8765", "max_records": 2, "custom": "keep me"}
    real.write_text(json.dumps(mine))
    real.chmod(0o640)
    result = CliRunner().invoke(eval_group, list(args[1:]), env={"RELAY_CONFIG": str(link)})
    assert result.exit_code == 0, result.output
    advice = json.loads((tmp_path / "rep" / "replay.json").read_text())["advice"]
    assert advice["current"]["max_records"] == 2  # the user's knob, not the default 3
    changes = advice["changes"]
    announced = re.search(r"^  knobs: (.*)$", result.output, re.M)[1]
    if changes:
        assert announced == ", ".join(
            f"{k} {advice['current'][k]} -> {v}" for k, v in changes.items()
        )
    assert link.is_symlink() and real.stat().st_mode & 0o777 == 0o640
    assert json.loads(real.read_text()) == {**mine, **changes}  # nothing it did not announce


def _cache_hits(url: str) -> float:
    """The server's count of searches answered from its cache (GET /metrics)."""
    lines = httpx.get(f"{url}/metrics").text.splitlines()
    return sum(float(x.split()[-1]) for x in lines if x.startswith("relay_search_cache_hits_total"))


def test_no_mode_of_a_teams_replay_is_served_cached_answers(team_server, tmp_path):
    """QA: against a running server every mode, the warm-up and the probe read with one key:
    the first conversation's turns waited 4-6 ms (the warm-up had asked them), and ungated,
    right after on on the same prompt, 4-10 ms against 56-100 uncached."""
    prompts = tmp_path / "prompts.jsonl"
    seen: set[str] = set()
    rows = []
    for s, turns in SESSIONS.items():
        for i, (p, k, g) in enumerate(turns, 1):
            if p not in seen:  # each prompt once: a mode asking it again may be served its own
                seen.add(p)
                rows.append({"prompt": p, "session": s, "turn": i, "kind": k, "relevant": g})
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = _cache_hits(team_server.url)
    args = ["replay", str(prompts), "--url", team_server.url, "--key", team_server.admin_key]
    result = CliRunner().invoke(eval_group, args + ["--report-dir", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    assert _cache_hits(team_server.url) == before
    keys = httpx.get(
        f"{team_server.url}/v1/keys", headers={"Authorization": f"Bearer {team_server.admin_key}"}
    ).json()["items"]
    minted = [k for k in keys if k["name"].startswith("relay-eval-")]
    assert len(minted) >= 3 and all(k["revoked_at"] for k in minted)  # revoked after


def test_one_read_key_is_refused_for_a_teams_replay(team_server, tmp_path):
    made = relay(
        *(tmp_path, "key", "create", "--org", "acme", "--name", "one"),
        *("--scope", "memory:read"),
        RELAY_DB=str(team_server.db),
    )
    reader = made.stdout.split("secret (shown once): ", 1)[1].strip()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "write a database migration by hand"}\n')
    done = relay(
        tmp_path, "eval", "replay", str(prompts), "--url", team_server.url, "--key", reader
    )
    assert "pass --key 3 times" in one_error_line(done) and done.returncode == 2


def _live_eval_keys(server) -> list[str]:  # noqa: ANN001
    keys = httpx.get(
        f"{server.url}/v1/keys", headers={"Authorization": f"Bearer {server.admin_key}"}
    ).json()["items"]
    return [k["id"] for k in keys if k["name"].startswith("relay-eval-") and not k["revoked_at"]]


def test_per_mode_keys_are_exactly_three_and_minted_ones_revoked_whatever_fails(
    team_server, tmp_path
):
    """Review: `--key a --key b --key c --key a` passed the check of three different keys
    and died in a ValueError traceback; keys minted before the work folder was made stayed
    live when making it failed (in a traceback: now one line naming --workdir)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "write a database migration by hand"}\n')
    replay = ("eval", "replay", str(prompts), "--url", team_server.url)
    admin = team_server.admin_key
    done = relay(tmp_path, *replay, *("--key", admin, "--key", "b", "--key", "c", "--key", admin))
    assert one_error_line(done).startswith("relay: error: --key: give 3 different keys")

    (tmp_path / "file").write_text("")
    before = _live_eval_keys(team_server)
    done = relay(tmp_path, *replay, "--key", admin, "--workdir", str(tmp_path / "file" / "sub"))
    assert one_error_line(done).startswith(f"relay: error: --workdir {tmp_path}")
    assert _live_eval_keys(team_server) == before


def test_keys_a_replay_could_not_revoke_are_named(team_server, capsys):
    """Review: revoking the keys a replay minted ignored a refusal, and a garbled answer
    (http.client.HTTPException) in that `finally` took the place of the error being raised:
    the ids are named, as they are left to expire in a day."""
    import socket
    import threading

    from relay.client import RelayClient
    from relay.eval.team import revoke

    revoke(RelayClient(team_server.url, team_server.admin_key), {"_minted": "key_nope,"})
    assert capsys.readouterr().err == (
        "relay: warning: could not revoke the keys this replay minted: key_nope (HTTP 404);"
        " they expire in a day\n"
    )

    garbled = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = garbled.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"not http\r\n\r\n")

    thread = threading.Thread(target=answer)
    thread.start()
    url = f"http://127.0.0.1:{garbled.getsockname()[1]}"
    try:
        revoke(RelayClient(url, team_server.admin_key), {"_minted": "key_a,"})
    finally:
        thread.join(10)
        garbled.close()
    err = capsys.readouterr().err
    assert err.startswith(
        "relay: warning: could not revoke the keys this replay minted: key_a ("
    ), err


def test_apply_replays_every_mode_at_the_runs_deadline_not_the_scripts(tmp_path, monkeypatch):
    """Review: for --apply, the `on` mode took the installed script's DEADLINE_MS while the
    others, and over_deadline, went by --deadline-ms: `on` was measured at another deadline.
    The script's other knobs are still the ones the advice starts from."""
    from relay.eval.advice import current_knobs, knob_environ

    script = tmp_path / ".relay" / "relay-autosearch-hook.sh"
    script.parent.mkdir()
    text = hook_script("/usr/bin/relay-hook").replace("DEADLINE_MS=400\n", "DEADLINE_MS=900\n")
    script.write_text(text.replace("MIN_PROMPT_LEN=15\n", "MIN_PROMPT_LEN=33\n"))
    monkeypatch.setenv("RELAY_CONFIG", str(tmp_path / ".relay" / "config.json"))
    monkeypatch.delenv("RELAY_DEADLINE_MS", raising=False)
    environ = knob_environ(None, True)
    assert "RELAY_DEADLINE_MS" not in environ, environ
    assert current_knobs(environ)["min_prompt_len"] == 33


def test_a_report_names_the_retrieval_code_measured_ranking_included(tmp_path):
    """Review: the report's hash of "the retrieval code as measured" was search.py's alone,
    and the features, models and preselection had moved to ranking.py and late.py: a
    change there measured under the same hash. It covers all three now, as documented."""
    from relay.eval.harness import RETRIEVAL_CODE, git_commit

    repo = git_repo_with(tmp_path, {path: f"# {path}\n" for path in RETRIEVAL_CODE})
    first = git_commit(repo)
    piped = subprocess.run(
        f"git hash-object {' '.join(RETRIEVAL_CODE)} | sha256sum",
        shell=True,
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    assert first["retrieval_code"] == piped.stdout.split()[0]
    (repo / "relay" / "ranking.py").write_text("# the gate, retuned\n")
    second = git_commit(repo)
    assert second["uncommitted"] == ["relay/ranking.py"]
    assert second["retrieval_code"] != first["retrieval_code"]


def git_repo_with(root, files: dict[str, str]):  # noqa: ANN001, ANN201
    """A git repository at `root` with `files` (path -> text) committed."""
    who = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    subprocess.run(["git", "-C", str(root), *who, "commit", "-q", "-m", "x"], check=True)
    return root


def test_the_cumulative_tokens_curve_ends_at_the_tables_figure():
    """QA: the report's curve averaged each turn over the conversations still going, so with
    conversations of different lengths its last point (2292) was not the table's (1654)."""
    hit = {"outcome": "hit", "ms": 50.0, "records": 1, "duplicates": 0}
    needed = {"kind": "needs_memory", "useful": True, "quiet": False}
    rows = [
        {"conversation": c, "turn": n, "turns": len(tokens), "tokens": t, **hit, **needed}
        for c, tokens in (("a", [10, 10]), ("b", [0, 5, 0, 5]))
        for n, t in enumerate(tokens, 1)
    ]
    # a: 10 held for 2 turns + 10 for 1 = 30; b: 5 for 3 turns + 5 for 1 = 20
    assert figures(rows, 2, classes=False)["tokens_cumulative"] == 25.0
    assert cumulative_by_turn(rows) == [5.0, 17.5, 20.0, 25.0]


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_a_run_stopped_while_its_server_starts_leaves_no_server_behind(team, tmp_path):
    """QA: a SIGTERM (a cancelled CI job) or a SIGINT to the replay alone while its `relay
    serve` was starting left that server running, orphaned, and the temporary folder it
    had just been removed from made again by it: the caller held no Server to stop yet."""
    import os
    import signal
    import time

    from integration_support import RELAY, clean_env

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    serve: list[int] = []
    with subprocess.Popen(
        [RELAY, "eval", "replay", str(team), "--report-dir", str(tmp_path / "rep")],
        env=clean_env(tmp_path, TMPDIR=str(tmp)),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    ) as run:
        try:
            assert run.stderr is not None
            for line in run.stderr:
                if line.startswith("starting relay serve"):
                    break
            deadline = time.monotonic() + 30
            while not serve and time.monotonic() < deadline:
                serve = _children(run.pid)
                time.sleep(0.02)
            assert serve, "relay serve was never started"
            run.send_signal(signal.SIGTERM)
            assert run.wait(60) == 143
            deadline = time.monotonic() + 15
            while _running(serve[0]) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not _running(serve[0]), f"relay serve {serve[0]} outlived the replay"
            assert list(tmp.iterdir()) == []
            assert not (tmp_path / "rep").exists()
        finally:
            run.kill()
            for pid in filter(_running, serve):
                os.kill(pid, signal.SIGKILL)


def test_a_server_that_will_not_start_is_one_line_and_listens_on_loopback(team, tmp_path):
    """QA: a setting of the shell's that `relay serve` refuses (RELAY_EMBED_THREADS=abc)
    ended the replay in a RuntimeError traceback naming a log in a folder already removed;
    and the server took the shell's RELAY_HOST, failing on one not of this machine (on
    0.0.0.0 it opened the replay's server to the network)."""
    from relay.eval.harness import Server
    from relay.store.sqlite import SQLiteStore

    done = relay(
        tmp_path,
        *("eval", "replay", str(team), "--report-dir", str(tmp_path / "rep")),
        RELAY_EMBED_THREADS="abc",
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "relay: error: relay serve exited before it answered: RELAY_EMBED_THREADS='abc' is not"
        " a valid embed_threads: 'abc' is not a whole number"
    )

    SQLiteStore(tmp_path / "relay.db").close()
    mp = pytest.MonkeyPatch()
    mp.setenv("RELAY_HOST", "192.0.2.1")  # TEST-NET-1: no address of this machine
    try:
        server = Server(tmp_path / "relay.db", tmp_path / "server.log")
    finally:
        mp.undo()
    try:
        assert httpx.get(f"{server.url}/healthz").status_code == 200
    finally:
        server.stop()


def test_a_workdir_holding_what_no_eval_put_there_is_refused_untouched(team, tmp_path):
    """QA: `--workdir` naming a folder with a server's own relay.db in it (~/.relay holds the
    default one) deleted that database, without a word but 'loading ... into a fresh
    database'."""
    work = tmp_path / "server-data"
    made = relay(tmp_path, "org", "create", "precious", RELAY_DB=str(work / "relay.db"))
    assert made.returncode == 0, made.stderr
    before = {p.name: p.read_bytes() for p in work.iterdir()}
    for command in ("replay", "faults"):
        done = relay(
            tmp_path,
            *("eval", command, str(team), "--workdir", str(work)),
            *("--report-dir", str(tmp_path / "rep")),
        )
        assert one_error_line(done) == (
            f"relay: error: --workdir {work}: it holds relay.db, which no relay eval put there,"
            " and a run deletes the relay.db (a server's database too) and homes/ it finds"
            " there: give an empty or a new folder"
        )
        assert done.returncode == 2
        assert {p.name: p.read_bytes() for p in work.iterdir()} == before
        assert not (tmp_path / "rep").exists()


def test_one_run_at_a_time_in_a_workdir_and_in_a_report_dir(team, tmp_path):
    """QA: two replays in one --workdir both exited 0 with figures of neither (the second
    emptied the first's homes/, then both hooks shared one state: outcomes 'missing', an
    ungated run 'skipped'); two in one --report-dir each printed the report path, which
    held the last one's report."""
    from integration_support import RELAY, clean_env

    from relay.eval.harness import Held

    work = tmp_path / "work"
    with subprocess.Popen(
        [RELAY, "eval", "faults", str(team), "--workdir", str(work)]
        + ["--report-dir", str(tmp_path / "rep")],
        env=clean_env(tmp_path),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    ) as first:
        _two_at_once(first, team, tmp_path, work)
    for folder in (work, tmp_path / "rep"):  # let go with the first run
        Held(folder, "--workdir").release()
    assert (work / ".relay-eval").exists()  # and the workdir is the next run's to use


def _two_at_once(first: subprocess.Popen, team: Path, tmp_path: Path, work: Path) -> None:
    """While `first` holds `work` and tmp_path/rep, replays there are refused; then it stops."""
    import signal

    try:
        assert first.stderr is not None
        assert first.stderr.readline().startswith("loading "), "the first run never started"
        for workdir, report in ((work, tmp_path / "rep2"), (tmp_path / "w2", tmp_path / "rep")):
            done = relay(
                tmp_path,
                *("eval", "replay", str(team), "--workdir", str(workdir)),
                *("--report-dir", str(report)),
            )
            option, folder = ("--workdir", work) if workdir == work else ("--report-dir", report)
            assert one_error_line(done) == (
                f"relay: error: {option} {folder}: another relay eval is using it: let it "
                "finish, or give another folder"
            )
            assert done.returncode == 2
        assert not (tmp_path / "rep2").exists() and not (tmp_path / "w2").exists()
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(60)
