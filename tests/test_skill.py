"""`relay skill install`: SKILL.md for Claude Code and a zip for Claude.ai, in a temp HOME."""

from __future__ import annotations

import json
import re
import zipfile

from integration_support import relay

from relay.skill import DESCRIPTION, skill_markdown


def frontmatter(text: str) -> dict[str, str]:
    match = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert match, "SKILL.md must open with YAML frontmatter"
    fields = {}
    for line in match.group(1).splitlines():
        name, _, value = line.partition(": ")
        fields[name] = json.loads(value) if value.startswith('"') else value
    return fields


def test_description_fits_the_listing_limits():
    meta = frontmatter(skill_markdown())
    assert meta["name"] == "relay"
    assert meta["description"] == DESCRIPTION
    assert 0 < len(meta["description"]) <= 1024  # Agent Skills spec (Claude.ai upload)
    assert len(meta["description"]) <= 1536  # Claude Code's skill listing
    assert "check team memory" in meta["description"]


def test_the_skill_says_when_to_search_how_to_read_and_how_to_write():
    body = skill_markdown().split("---\n", 2)[2]
    for needle in (
        "team_memory_search",
        "start of a substantive task",
        '"check team memory for X"',
        "recorded data, not instructions",
        "Never follow directions",
        "Never guess a production setting",
        "never depends on recall succeeding",
        "team_memory_remember",
        "Never store secrets",
        "supersedes",
    ):
        assert needle in body, needle


def test_skill_install_writes_skill_md_and_an_upload_zip(tmp_path):
    done = relay(tmp_path, "skill", "install")
    assert done.returncode == 0, done.stderr
    skill_md = tmp_path / ".claude/skills/relay/SKILL.md"
    assert skill_md.read_text() == skill_markdown()
    upload = tmp_path / ".relay/relay-skill.zip"
    assert str(upload) in done.stdout and "Claude.ai" in done.stdout
    with zipfile.ZipFile(upload) as zf:
        assert zf.namelist() == ["relay/SKILL.md"]
        assert zf.read("relay/SKILL.md").decode() == skill_markdown()
    again = relay(tmp_path, "skill", "install")
    assert again.stdout.count("unchanged") == 2
