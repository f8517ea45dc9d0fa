"""`relay bench search` end to end at a tiny size: real stores, real model, real servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from relay.cli import cli

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "bench"
THROUGHPUT = ["--seconds", "1", "--clients", "2"]


@pytest.fixture
def tiny_bench(tmp_path: Path) -> Path:
    """The first rows of the shared bench's real texts and queries, in its own layout."""
    if not (SHARED / "cursorrules_bullets" / "memories.jsonl").exists():
        pytest.skip(f"benchmark data not present at {SHARED}")
    for name, rows in (
        ("cursorrules_bullets/memories.jsonl", 60),
        ("cursorrules_bullets/queries.jsonl", 4),
        ("coding_prompts/queries.jsonl", 4),
    ):
        (tmp_path / "bench" / name).parent.mkdir(parents=True, exist_ok=True)
        lines = (SHARED / name).read_text().splitlines()[:rows]
        (tmp_path / "bench" / name).write_text("\n".join(lines) + "\n")
    return tmp_path / "bench"


def _bench(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["bench", "search", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output[result.output.index("{") :])


def _check_orgs100(data: dict, store: str, sizes: list[int]) -> None:
    assert data["store"] == store and data["layout"] == "orgs100" and data["queries"] == 8
    assert [r["passages"] for r in data["runs"]] == sizes
    for run in data["runs"]:
        assert run["orgs"] == {
            "small": round(run["passages"] / 100),
            "big": run["passages"] * 2 // 5,
        }
        for org in ("small", "big"):
            figures = run["in_process"][org]
            for stage in ("embed", "semantic", "lexical", "tokens", "passages", "pipeline"):
                ms = figures[f"{stage}_ms"]
                assert 0 < ms["p50"] <= ms["p95"] <= ms["p99"], (org, stage, ms)
            assert figures["recall_at_5"] == 1.0  # exact or near-exact at this size
            assert run[f"http_ms_{org}"]["p50"] > 0
        (level,) = run["throughput"]
        assert level["clients"] == 2 and level["qps"] > 0 and level["errors"] == 0
        assert len(run["server_rss_mb"]) == 2 and min(run["server_rss_mb"]) > 50
        assert len(run["load_avg_before"]) == 3 and len(run["load_avg_after"]) == 3
        if run["ingest_rows_per_s"] is not None:
            assert run["tokens_backfilled"] == 0  # loaded rows come with their token matrices


@pytest.mark.postgres
def test_postgresql_orgs100_measures_grows_and_reuses_a_database(pg_url, tiny_bench, tmp_path):
    from postgres_support import truncate_all

    truncate_all(pg_url)
    out = tmp_path / "pg.json"
    common = ["--store", "postgresql", "--db", pg_url, "--bench-dir", str(tiny_bench)]
    first = _bench(*common, "--memories", "300", "--json", str(out), *THROUGHPUT)
    assert json.loads(out.read_text()) == first
    _check_orgs100(first, "postgresql", [300])
    run = first["runs"][0]
    assert run["ingest_rows_per_s"] > 0 and run["hnsw_build_s"] >= 0
    assert run["in_process"]["small"]["vector_plan"] == "exact"
    assert 0 <= run["in_process"]["small"]["plain_hnsw_recall_at_5"] <= 1
    assert run["size_mb"]["database"] > 0

    # Same database, as if written before relay.late: 300 is measured as it stands once its
    # token matrices are backfilled, 600 is loaded on top of it.
    import psycopg

    from relay.store.postgres import parse_url

    with psycopg.connect(parse_url(pg_url).conninfo, autocommit=True) as conn:
        conn.execute("TRUNCATE passage_tokens")
    again = _bench(*common, "--sizes", "300,600", *THROUGHPUT)
    _check_orgs100(again, "postgresql", [300, 600])
    assert again["runs"][0]["ingest_rows_per_s"] is None
    assert again["runs"][0]["tokens_backfilled"] == 300
    assert again["runs"][1]["ingest_rows_per_s"] > 0


def test_sqlite_orgs100_side_by_side_layout(tiny_bench, tmp_path):
    args = ["--layout", "orgs100", "--memories", "200", "--bench-dir", str(tiny_bench)]
    args += ["--db", str(tmp_path / "orgs.db"), *THROUGHPUT]
    data = _bench(*args)
    _check_orgs100(data, "sqlite", [200])
    assert data["runs"][0]["ingest_rows_per_s"] > 0
    assert "vector_plan" not in data["runs"][0]["in_process"]["small"]
    assert _bench(*args)["runs"][0]["ingest_rows_per_s"] is None  # reused, not re-ingested


def test_sqlite_one_org_keeps_the_issue_2_schema(tiny_bench):
    data = _bench("--memories", "120", "--bench-dir", str(tiny_bench))
    assert set(data) == {
        "memories",
        "queries",
        "ingest_per_s",
        "tokens_backfilled",
        "search_ms",
        "http_ms",
        "rss_mb",
        "embedder",
    }
    assert data["memories"] == 120 and data["search_ms"]["p50"] > 0 and data["rss_mb"] > 50
    assert data["tokens_backfilled"] == 0  # written with their token matrices


def test_sqlite_one_org_backfills_a_reused_database_from_before_token_matrices(
    tiny_bench, tmp_path
):
    import sqlite3

    from relay.store.sqlite import SQLiteStore

    db = tmp_path / "one.db"
    args = ["--memories", "120", "--bench-dir", str(tiny_bench), "--db", str(db)]
    _bench(*args)
    with sqlite3.connect(db) as conn:  # as a database written before relay.late
        conn.execute("DELETE FROM passage_tokens")
    store = SQLiteStore(db)
    try:
        assert len(store.missing_tokens(1000)) == 120
        again = _bench(*args)
        assert again["ingest_per_s"] is None  # reused, not re-ingested ...
        assert again["tokens_backfilled"] == 120  # ... but given its matrices before measuring
        assert store.missing_tokens(1000) == []
    finally:
        store.close()


def test_layout_and_store_mismatch_is_a_usage_error():
    result = CliRunner().invoke(
        cli, ["bench", "search", "--store", "postgresql", "--layout", "one-org"]
    )
    assert result.exit_code == 2 and "one-org" in result.output
