"""`relay bench` as a user types it: what it refuses, in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
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


@pytest.mark.parametrize(
    "option, typed, bad",
    [
        ("--sizes", "5_0", "5_0"),
        ("--sizes", "20, 30", " 30"),  # each below orgs100's least, as --sizes 5
        ("--clients", "+4", "+4"),
        ("--clients", "4,1_6", "1_6"),
        ("--clients", "4,0", "0"),
    ],
)
def test_a_list_of_whole_numbers_is_read_as_integer_options_are(option, typed, bad):
    """`relay bench search --sizes 1_000` measured 1000 memories: the lists were read with
    int(), which every integer option stopped using (StrictInt). Each number is digits alone,
    1 or more. (--sizes 5 is too small for orgs100, refused next: a list read loosely would
    say that instead, and no benchmark runs either way.)"""
    args = ["bench", "search", "--layout", "orgs100", "--sizes", "5", option, typed]
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 2, done.output
    assert (
        f"Invalid value for {option}: {bad!r} is not a whole number of 1 or more (digits only,"
        " comma-separated)"
    ) in done.output, done.output
