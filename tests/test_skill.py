"""`relay skill install`: SKILL.md for Claude Code and a zip for Claude.ai, in a temp HOME."""

from __future__ import annotations

import json
import re
import stat
import zipfile
from hashlib import sha256
from pathlib import Path

from integration_support import relay, snapshot

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


# -- relay uninstall takes the skill out again --------------------------------------------------
def manifest_of(home: Path) -> dict:
    return json.loads((home / ".relay/install.json").read_text())


def test_uninstall_removes_the_skill_files_it_recorded(tmp_path):
    """`relay uninstall` left SKILL.md and the zip behind: skill install recorded nothing.
    It records them now, and uninstall takes them out, folders it made included."""
    home, elsewhere = tmp_path / "home", tmp_path / "skills"
    home.mkdir()
    assert relay(home, "skill", "install").returncode == 0
    assert relay(home, "skill", "install", "--dir", str(elsewhere)).returncode == 0
    assert set(manifest_of(home)["skills"]) == {
        str(home / ".claude/skills/relay/SKILL.md"),
        str(home / ".relay/relay-skill.zip"),
        str(elsewhere / "relay/SKILL.md"),
    }
    assert stat.S_IMODE((home / ".relay/install.json").stat().st_mode) == 0o600
    installed = snapshot(home)
    dry = relay(home, "uninstall", "--dry-run")
    assert dry.returncode == 0 and "would remove   ~/.claude/skills/relay/SKILL.md" in dry.stdout
    assert snapshot(home) == installed
    done = relay(home, "uninstall")
    assert done.returncode == 0, done.stderr
    # QA: it said "No `relay install` recorded: removing Relay's entries only"
    only_skill = (
        "No `relay install` recorded, only `relay skill install`: removing the skill it wrote."
    )
    assert dry.stdout.splitlines()[0] == done.stdout.splitlines()[0] == only_skill
    assert "removed    ~/.claude/skills/relay/SKILL.md  (Relay skill)" in done.stdout
    assert "removed    ~/.relay/relay-skill.zip" in done.stdout
    assert list(home.iterdir()) == [] and not elsewhere.exists()


def test_uninstall_after_skill_install_names_the_hook_script_it_finds_too(tmp_path):
    """No `relay install` recorded, but a recall hook script where install puts it: both go,
    and the first line says so."""
    from relay.agents import SCRIPT_NAME

    assert relay(tmp_path, "skill", "install").returncode == 0
    (tmp_path / ".relay" / SCRIPT_NAME).write_text("#!/bin/sh\n")
    done = relay(tmp_path, "uninstall")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == (
        "No `relay install` recorded: removing the skill `relay skill install` wrote, and"
        " Relay's entries where install puts them."
    )
    assert "removed    ~/.relay/" + SCRIPT_NAME in done.stdout
    assert not (tmp_path / ".relay" / SCRIPT_NAME).exists()


def test_uninstall_keeps_a_skill_md_the_user_edited_and_says_so(tmp_path):
    assert relay(tmp_path, "skill", "install").returncode == 0
    skill_md = tmp_path / ".claude/skills/relay/SKILL.md"
    edited = skill_markdown() + "\n## Our own notes\n\nAsk Dana before a deploy.\n"
    skill_md.write_text(edited)
    dry = relay(tmp_path, "uninstall", "--dry-run")
    assert "would keep     ~/.claude/skills/relay/SKILL.md  (changed since" in dry.stdout
    done = relay(tmp_path, "uninstall")
    assert done.returncode == 0, done.stderr
    assert (
        "kept       ~/.claude/skills/relay/SKILL.md  (changed since `relay skill install` "
        "wrote it; left as it is)" in done.stdout
    )
    assert skill_md.read_text() == edited
    assert snapshot(tmp_path) == {".claude/skills/relay/SKILL.md": (edited.encode(), 0o644)}


def test_project_uninstall_removes_that_projects_skill_only(tmp_path):
    home, mine, other = tmp_path / "home", tmp_path / "mine", tmp_path / "other"
    for folder in (home, mine, other):
        folder.mkdir()
    assert relay(home, "skill", "install").returncode == 0
    assert relay(home, "skill", "install", "--project", str(other)).returncode == 0
    # A relative DIR, from inside the project, is recorded as the same absolute path.
    assert relay(home, "skill", "install", "--project", ".", cwd=mine).returncode == 0
    home_installed, other_installed = snapshot(home), snapshot(other)
    manifest = manifest_of(home)
    assert str(mine / ".claude/skills/relay/SKILL.md") in manifest["skills"]

    dry = relay(home, "uninstall", "--project", str(mine), "--dry-run")
    assert dry.returncode == 0 and f"would remove   {mine}/.claude/skills/relay" in dry.stdout
    assert snapshot(mine) != {} and manifest_of(home) == manifest
    done = relay(home, "uninstall", "--project", str(mine))
    assert done.returncode == 0, done.stderr
    assert list(mine.iterdir()) == []  # the folders skill install made went too
    assert snapshot(other) == other_installed
    assert set(home_installed) == set(snapshot(home))
    skills = manifest_of(home)["skills"]
    assert skills == {p: r for p, r in manifest["skills"].items() if not p.startswith(str(mine))}


def test_without_a_record_uninstall_removes_only_an_exact_skill_md(tmp_path):
    """No install.json: the skill in its default place goes when it is byte for byte the
    one this Relay writes, and stays, said so, when it is not."""
    home = tmp_path
    assert relay(home, "skill", "install").returncode == 0
    (home / ".relay/install.json").unlink()
    done = relay(home, "uninstall")
    assert done.returncode == 0, done.stderr
    assert "No install record" in done.stdout and "removed    ~/.claude/skills/relay" in done.stdout
    assert not (home / ".claude/skills/relay").exists() and snapshot(home) == {}

    assert relay(home, "skill", "install").returncode == 0
    (home / ".relay/install.json").unlink()
    skill_md = home / ".claude/skills/relay/SKILL.md"
    skill_md.write_text(skill_markdown().replace("Relay team memory", "Our team memory"))
    done = relay(home, "uninstall")
    assert done.returncode == 0, done.stderr
    assert "kept       ~/.claude/skills/relay/SKILL.md" in done.stdout
    assert skill_md.exists() and not (home / ".relay/relay-skill.zip").exists()


# -- what skill install replaces is kept, and put back ------------------------------------------
def test_skill_install_keeps_a_file_it_replaces_and_uninstall_puts_it_back(tmp_path):
    """QA: `relay skill install` overwrote a SKILL.md the user wrote, and the file at --zip,
    without a backup; `relay uninstall` then deleted both (they matched what Relay wrote).
    Each is now backed up as relay install backs up (~/.relay/backups, mode 600), and the
    record's `original` brings it back."""
    home = tmp_path
    skill_md = home / ".claude/skills/relay/SKILL.md"
    skill_md.parent.mkdir(parents=True)
    mine = b"---\nname: relay\ndescription: our relay runbook\n---\n\nPage Dana first.\n"
    skill_md.write_bytes(mine)
    upload = home / "uploads/skill.zip"
    upload.parent.mkdir()
    upload.write_bytes(b"PK my own zip")
    before = snapshot(home)

    done = relay(home, "skill", "install", "--zip", str(upload))
    assert done.returncode == 0, done.stderr
    assert skill_md.read_text() == skill_markdown()
    backups = sorted((home / ".relay/backups").iterdir())
    assert [b.read_bytes() for b in backups] == [mine, b"PK my own zip"]
    assert all(stat.S_IMODE(b.stat().st_mode) == 0o600 for b in backups)
    assert f"what was there is kept in ~/.relay/backups/{backups[0].name})" in done.stdout
    assert f"what was there is kept in ~/.relay/backups/{backups[1].name})" in done.stdout
    recorded = manifest_of(home)["skills"]
    assert recorded[str(skill_md)]["original"] == str(backups[0])
    assert recorded[str(upload)]["original"] == str(backups[1])
    # Run again: nothing replaced, nothing more kept, and the original stays recorded.
    again = relay(home, "skill", "install", "--zip", str(upload))
    assert again.stdout.count("unchanged") == 2 and "kept in" not in again.stdout
    assert manifest_of(home)["skills"] == recorded

    dry = relay(home, "uninstall", "--dry-run")
    assert "would restore  ~/.claude/skills/relay/SKILL.md" in dry.stdout, dry.stdout
    assert f"would remove   ~/.relay/backups/{backups[0].name}" in dry.stdout
    done = relay(home, "uninstall")
    assert done.returncode == 0, done.stderr
    assert (
        "restored   ~/.claude/skills/relay/SKILL.md  (without Relay skill; what it replaced is"
        " back)" in done.stdout
    )
    assert snapshot(home) == before  # the user's files as they were, and nothing of Relay's


def test_an_edited_relay_skill_replaced_by_a_later_install_is_kept_through_uninstall(tmp_path):
    """A Relay SKILL.md the user added to is backed up when a later skill install replaces
    it; uninstall removes Relay's skill (it replaced nothing of the user's at first) and
    leaves that backup, saying so: it holds the user's words."""
    home = tmp_path
    assert relay(home, "skill", "install").returncode == 0
    skill_md = home / ".claude/skills/relay/SKILL.md"
    edited = skill_markdown() + "\n## Our own notes\n\nAsk Dana before a deploy.\n"
    skill_md.write_text(edited)
    done = relay(home, "skill", "install")
    assert done.returncode == 0, done.stderr
    (backup,) = (home / ".relay/backups").iterdir()
    assert backup.read_text() == edited and skill_md.read_text() == skill_markdown()
    entry = manifest_of(home)["skills"][str(skill_md)]
    assert "original" not in entry and entry["backups"] == [str(backup)]
    done = relay(home, "uninstall")
    assert done.returncode == 0, done.stderr
    assert "removed    ~/.claude/skills/relay/SKILL.md  (Relay skill)" in done.stdout
    assert (
        f"kept       ~/.relay/backups/{backup.name}  (what skill install replaced at {skill_md};"
        " kept, yours to delete)" in done.stdout
    )
    assert snapshot(home) == {f".relay/backups/{backup.name}": (edited.encode(), 0o600)}


def test_a_skill_an_older_relay_recorded_is_replaced_without_a_backup(tmp_path):
    """What the record says skill install wrote (an older skill, say) is Relay's own: a
    newer skill over it keeps nothing, and a record without backups (as an older Relay
    wrote them) is undone as before."""
    home = tmp_path
    assert relay(home, "skill", "install").returncode == 0
    skill_md = home / ".claude/skills/relay/SKILL.md"
    older = skill_markdown().replace("Relay team memory", "Relay memory").encode()
    skill_md.write_bytes(older)
    manifest = manifest_of(home)
    manifest["skills"][str(skill_md)] = {"role": "skill", "sha256": sha256(older).hexdigest()}
    (home / ".relay/install.json").write_text(json.dumps(manifest))
    done = relay(home, "skill", "install")
    assert done.returncode == 0, done.stderr
    assert "updated    " in done.stdout and "kept in" not in done.stdout
    assert not (home / ".relay/backups").exists()
    assert relay(home, "uninstall").returncode == 0
    assert snapshot(home) == {}


def test_a_target_that_is_not_a_file_is_refused_before_anything(tmp_path):
    """Reviewer: --zip /dev/full read without end (to back it up) until the kernel killed it,
    and a FIFO waited for ever."""
    import os

    fifo = tmp_path / "upload.zip"
    os.mkfifo(fifo)
    done = relay(tmp_path, "skill", "install", "--zip", str(fifo), "--dir", str(tmp_path / "s"))
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"relay: error: {fifo} is there and is not a file: give another path; nothing was written\n"
    )
    assert not (tmp_path / "s").exists()


def test_dir_and_project_together_are_refused_before_anything(tmp_path):
    """QA: --project was ignored next to --dir, yet the output offered `relay uninstall
    --project P` for "this project's only", which then said "Nothing recorded"."""
    home, project = tmp_path / "home", tmp_path / "p"
    home.mkdir()
    project.mkdir()
    args = ("--dir", str(tmp_path / "s"), "--project", str(project))
    done = relay(home, "skill", "install", *args)
    assert done.returncode == 2, done.stdout
    assert done.stderr == (
        "relay: error: --dir and --project both say where SKILL.md goes: give --project DIR for"
        " DIR/.claude/skills, or --dir alone; nothing was written (see 'relay skill install"
        " --help')\n"
    )
    assert snapshot(tmp_path) == {}
