"""`relay bench hook` end to end, small: against a fake server, a few runs of each series."""

from __future__ import annotations

import json

from click.testing import CliRunner
from hook_support import FakeRelay, record, reply, results

from relay.cli.bench import bench_hook as hook
from relay.hook_bench import FAULT_KINDS, quiet


def test_bench_hook_writes_exactly_the_documented_schema(tmp_path):
    out = tmp_path / "hook.json"
    with FakeRelay(reply(200, results(record("mem_a")))) as server:
        result = CliRunner().invoke(
            hook,
            ["--url", server.url, "--key", "relay_k_s", "--memories", "3", "--runs", "3"]
            + ["--fault-runs", "1", "--json", str(out)],
        )
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert set(data) == {
        "memories",
        "hit_ms",
        "skip_ms",
        "floor_curl_ms",
        "floor_python_ms",
        "server_search_ms",
        "clock_over_ms",
        "faults",
    }
    assert data["memories"] == 3
    for series in ("hit_ms", "skip_ms", "floor_curl_ms", "floor_python_ms", "server_search_ms"):
        assert set(data[series]) == {"p50", "p95", "p99"}
    assert data["hit_ms"]["p50"] > 0 and data["server_search_ms"]["p50"] == 1.5
    # the hook's own clock: never more than /proc's 10 ms tick ahead of the wall (it was
    # ahead by its imports' time when its start was dated against its import's reading)
    assert set(data["clock_over_ms"]) == {"p50", "p95", "p99", "max"}
    assert data["clock_over_ms"]["max"] <= 12, data["clock_over_ms"]
    assert set(data["faults"]) == set(FAULT_KINDS)
    for kind, figures in data["faults"].items():
        assert figures["runs"] == 1 and figures["ok"] == 1, (kind, figures)
        assert set(figures) == {"runs", "ok", "max_ms"}
    assert "floor_python_ms" in result.output


def test_quiet_allows_only_a_system_message():
    assert quiet(b"") and quiet(b"\n") and quiet(b'{"systemMessage": "key rejected"}')
    assert not quiet(b'{"hookSpecificOutput": {}}') and not quiet(b"oops")
