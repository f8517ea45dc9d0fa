"""Fast variants of the drills (`relay drill ...` runs the long ones; see BENCHMARKS.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay.drills import crash, fuzz, isolation, load, safety
from relay.drills.common import Served

pytestmark = pytest.mark.drill


def test_isolation_model_finds_no_leak(store, embedder):
    """Random operations across orgs, keys, roles, expiries, deletions and revocations,
    cache on: every answer agrees with the reference model (both stores)."""
    result = isolation.run(700, seed=11, embedder=embedder, store=store)
    assert result["ops"] >= 690
    assert result["by_op"]["search"] > 150 and result["by_op"]["revoke"] >= 1
    assert result["leaks"] == 0, result["leak_examples"]


def test_isolation_model_catches_a_leak(embedder, monkeypatch):
    """The model has teeth: a recall that ignores audiences is reported as a leak."""
    from relay.store.sqlite import reads, search

    for module in (reads, search):  # where the recall filter is built and where it is used
        monkeypatch.setattr(module, "visible_sql", lambda count: "m.deleted_at IS NULL")
    result = isolation.run(250, seed=3, embedder=embedder)
    assert result["leaks"] > 0


def test_crash_kill9_loses_no_acknowledged_write():
    result = crash.run(3, seed=5, min_s=0.3, max_s=1.0)
    assert result["acknowledged_writes"] > 0
    assert result["integrity_failures"] == 0
    assert result["losses"] == 0, result["loss_examples"]


def test_api_fuzz_no_5xx_one_error_shape_nothing_stored():
    result = fuzz.api(150, seed=5)
    assert result["api_inputs"] == 150
    assert result["problems"] == []


def test_hook_fuzz_stdin_and_responses_exit_0_one_json_object():
    result = fuzz.hook(20, seed=5)
    assert result["hook_stdin_inputs"] == result["hook_response_inputs"] == 20
    assert result["problems"] == []


def test_schemathesis_from_openapi_finds_no_server_error(tmp_path: Path):
    pytest.importorskip("schemathesis")
    server = Served(str(tmp_path / "relay.db"), tmp_path / "serve.log").start()
    try:
        result = fuzz.schemathesis_run(
            server.url, server.admin_key, 3, 5, tmp_path / "st.ndjson", phases="fuzzing"
        )
    finally:
        server.stop()
    assert result["exit"] == 0, result["summary"]


def test_load_short_soak_then_overload_sheds_fast_and_hook_stays_on_time():
    result = load.run(3, workers=3, memories=60, seed=5, overload_seconds=3)
    assert result["soak"]["requests"] > 20
    assert result["overload"]["shed_503"] > 0
    assert result["overload"]["hook_runs"] > 0
    assert load.failures(result, max_rss_growth_mib=64) == []


def test_safety_no_key_logged_secrets_refused_recall_quoted_files_private():
    result = safety.run()
    assert result["problems"] == []
