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


NOT_AN_INTEGER = "is not a valid integer (decimal digits only)."


@pytest.mark.parametrize(
    "option, typed, said",
    [
        ("--sizes", "5_0", f"'5_0' {NOT_AN_INTEGER}"),
        ("--sizes", "20, 30", f"' 30' {NOT_AN_INTEGER}"),  # each below orgs100's least, as 5
        ("--sizes", "9" * 5000, "is not a valid integer range."),  # past int()'s limit
        ("--clients", "+4", f"'+4' {NOT_AN_INTEGER}"),
        ("--clients", "4,1_6", f"'1_6' {NOT_AN_INTEGER}"),
        ("--clients", "4,0", "0 is not in the range x>=1."),
    ],
)
def test_a_list_of_whole_numbers_is_read_as_integer_options_are(option, typed, said):
    """`relay bench search --sizes 1_000` measured 1000 memories: the lists were read with
    int(), which every integer option stopped using (StrictInt). Each number is read as a
    StrictInt of 1 or more. (--sizes 5 is too small for orgs100, refused next: a list read
    loosely would say that instead, and no benchmark runs either way.)"""
    args = ["bench", "search", "--layout", "orgs100", "--sizes", "5", option, typed]
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 2, done.output
    assert f"Invalid value for {option}: " in done.output, done.output
    assert said in " ".join(done.output.split()), done.output
