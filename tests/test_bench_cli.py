"""`relay bench` as a user types it: what it refuses, in one line."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from relay.cli import cli


def test_bench_recall_on_a_folder_without_the_data_is_one_line(tmp_path: Path):
    """QA: `relay bench recall empty-folder` was a FileNotFoundError traceback."""
    done = CliRunner().invoke(cli, ["bench", "recall", str(tmp_path)])
    assert done.exit_code == 2, done.output
    assert f"{tmp_path} has no memories.jsonl: is it a ../shared/bench folder?" in done.output
    (tmp_path / "memories.jsonl").write_text("", encoding="utf-8")
    done = CliRunner().invoke(cli, ["bench", "recall", str(tmp_path)])
    assert done.exit_code == 2 and "has no queries.jsonl" in done.output, done.output
