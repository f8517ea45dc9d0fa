"""`relay import` as a user runs it, from different folders, against a real server."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import httpx
import pytest
from integration_support import (
    RELAY,
    BatchProxy,
    clean_env,
    start_module_server,
    stop_server,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    live = start_module_server(tmp_path_factory, "import")
    yield live
    stop_server(live)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def git_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def git(repo: Path, *args: str) -> str:
    """`git ARGS` in `repo`, committing as a test author; its output."""
    who = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
    done = subprocess.run(
        ["git", "-C", str(repo), *who, *args], check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


def relay_import(
    server,
    cwd: Path,
    *args: str,
    key: str | None = None,
    home: Path | None = None,
    **extra: str,
) -> subprocess.CompletedProcess:
    """`relay import ARGS` run from `cwd`, as the server's admin (or with `key`), with HOME
    `home` (default: `cwd`) and the environment's `extra` variables."""
    env = clean_env(
        home or cwd, RELAY_URL=server.url, RELAY_API_KEY=key or server.admin_key, **extra
    )
    return subprocess.run(
        [RELAY, "import", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def live_memories(server, source: str) -> list[dict]:
    response = httpx.get(
        f"{server.url}/v1/memories",
        params={"source": source, "limit": 500},
        headers={"Authorization": f"Bearer {server.admin_key}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.json()["items"]


def every_memory(server) -> list[dict]:
    response = httpx.get(
        f"{server.url}/v1/memories",
        params={"limit": 500},
        headers={"Authorization": f"Bearer {server.admin_key}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.json()["items"]


def summary(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# --- sources that name the file, not the working directory ----------------------------------


def test_same_file_name_in_two_repositories_stays_apart(tmp_path, server):
    for repo, rule in (("shop-backend", "Use black."), ("shop-frontend", "Use prettier.")):
        write(git_repo(tmp_path / repo) / "AGENTS.md", f"## Code style\n{rule}\n")
        done = relay_import(server, tmp_path / repo, "AGENTS.md")
        assert summary(done) == "imported 1 memory: 1 new or changed, 0 unchanged, 0 retired"

    (backend,) = live_memories(server, "shop-backend/AGENTS.md")
    (frontend,) = live_memories(server, "shop-frontend/AGENTS.md")
    assert (backend["body"], backend["revision"]) == ("Use black.", 1)
    assert (frontend["body"], frontend["revision"]) == ("Use prettier.", 1)
    assert backend["id"] != frontend["id"]


def test_two_gitlab_repositories_named_alike_in_different_groups_stay_apart(tmp_path, server):
    """QA: `platform/infra/terraform` and `data/infra/terraform` were both recorded as
    `infra/terraform/AGENTS.md`: importing the second overwrote the first's memory."""
    for group, rule in (("platform", "Plan before apply."), ("data", "Apply from CI only.")):
        repo = git_repo(tmp_path / group / "terraform")
        remote = f"git@gitlab.example.com:{group}/infra/terraform.git"
        subprocess.run(["git", "-C", str(repo), "remote", "add", "origin", remote], check=True)
        write(repo / "AGENTS.md", f"## Terraform\n{rule}\n")
        done = relay_import(server, repo, "AGENTS.md")
        assert summary(done) == "imported 1 memory: 1 new or changed, 0 unchanged, 0 retired"

    assert bodies(server, "platform/infra/terraform/AGENTS.md") == ["Plan before apply."]
    assert bodies(server, "data/infra/terraform/AGENTS.md") == ["Apply from CI only."]
    assert bodies(server, "infra/terraform/AGENTS.md") == []


def test_another_repositorys_memories_under_a_former_two_part_name_are_never_named(
    tmp_path, server
):
    """Review: every import of a GitLab subgroup's ops/infra/tfz named the memories under
    its former two-part name, infra/tfz, for relay forget, though they were another
    repository's whose name that is today (its remote infra/tfz.git), live and imported
    again by its team: forgetting them as told deleted that team's memories. Only what the
    store shows is this repository's is named: here infra/tfz holds a file ops/infra/tfz
    never had, so not even its section of the very same text is, nor retired when asked."""
    a = git_repo(tmp_path / "a" / "tfz")
    git(a, "remote", "add", "origin", "git@gitlab.example.com:infra/tfz.git")
    write(a / "AGENTS.md", "## Secrets\nIn vault.\n\n## Build\nRun make.\n")
    write(a / "README.md", "# Readme\nThe infra team's.\n")
    b = git_repo(tmp_path / "b" / "tfz")
    git(b, "remote", "add", "origin", "git@gitlab.example.com:ops/infra/tfz.git")
    write(b / "AGENTS.md", "## Secrets\nIn vault.\n\n## Build\nRun ninja.\n")
    first = relay_import(server, a, "AGENTS.md", "README.md")
    assert summary(first) == "imported 3 memories: 3 new or changed, 0 unchanged, 0 retired"
    before = live_memories(server, "infra/tfz/AGENTS.md")

    for args in ((), ("--retire-former-name",)):
        done = relay_import(server, b, *args, "AGENTS.md")
        assert summary(done).endswith(" 0 retired"), done.stdout
        assert "infra/tfz/" not in done.stderr, done.stderr
        assert all(m["id"] not in done.stderr for m in before), done.stderr
    assert live_memories(server, "infra/tfz/AGENTS.md") == before  # ids, text, revisions
    mine = live_memories(server, "ops/infra/tfz/AGENTS.md")
    assert sorted(m["body"] for m in mine) == ["In vault.", "Run ninja."]
    again = relay_import(server, a, "AGENTS.md")
    assert summary(again) == "imported 2 memories: 0 new or changed, 2 unchanged, 0 retired"
    assert live_memories(server, "ops/infra/tfz/AGENTS.md") == mine


def test_copies_an_older_release_made_under_a_former_name_are_named_until_retired(tmp_path, server):
    """Review: the note naming memories under a repository's former two-part name came back
    on every import, one per file, each with ids to relay forget one by one. What the store
    shows came from this repository (its former name holds only its files, on disk or
    deleted by its history; a memory with the title and text of a section imported now) is
    named in one note while it is there, and --retire-former-name retires it; a section
    edited since is no copy, and is left unnamed."""
    repo = git_repo(tmp_path / "ops" / "tfy")
    git(repo, "remote", "add", "origin", "git@gitlab.example.com:ops/infra/tfy.git")
    write(repo / "AGENTS.md", "## Build\nRun make.\n\n## Test\nRun pytest.\n")
    write(repo / "docs" / "deploy.md", "# Deploy\nTag from main.\n")
    write(repo / "docs" / "gone.md", "# Gone\nDeleted since.\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "docs")
    # What a release before the whole remote path named repositories wrote.
    summary(relay_import(server, repo, "--source-prefix", "infra/tfy", "AGENTS.md", "docs"))
    build = [m for m in live_memories(server, "infra/tfy/AGENTS.md") if m["title"] == "Build"]
    (gone,) = live_memories(server, "infra/tfy/docs/gone.md")
    git(repo, "rm", "-q", "docs/gone.md")
    git(repo, "commit", "-q", "-m", "gone")
    write(repo / "AGENTS.md", "## Build\nRun ninja.\n\n## Test\nRun pytest.\n")

    note = (
        "relay: note: 2 memories under infra/tfy/ (infra/tfy/AGENTS.md and 1 more) copy"
        " sections imported here: an older release made them when this repository's remote"
        " was named by its last two parts (infra/tfy); left as they are, recalled beside"
        " this import's; import again with --retire-former-name to retire them"
    )
    done = relay_import(server, repo, "AGENTS.md", "docs")
    assert summary(done) == "imported 3 memories: 3 new or changed, 0 unchanged, 0 retired"
    assert note in done.stderr, done.stderr
    again = relay_import(server, repo, "AGENTS.md", "docs")
    assert summary(again) == "imported 3 memories: 0 new or changed, 3 unchanged, 0 retired"
    assert note in again.stderr, again.stderr  # while they are there
    retired = relay_import(server, repo, "--retire-former-name", "AGENTS.md", "docs")
    assert summary(retired) == "imported 3 memories: 0 new or changed, 3 unchanged, 2 retired"
    assert live_memories(server, "infra/tfy/docs/deploy.md") == []
    assert live_memories(server, "infra/tfy/AGENTS.md") == build  # edited since: no copy
    assert live_memories(server, "infra/tfy/docs/gone.md") == [gone]
    after = relay_import(server, repo, "AGENTS.md", "docs")
    assert "infra/tfy/" not in after.stderr, after.stderr
    refused = relay_import(server, repo, "--retire-former-name", "--keep-removed", "AGENTS.md")
    assert refused.returncode == 2, refused.stderr


def test_a_link_only_this_machine_made_leaves_the_files_memories(tmp_path, server):
    """Review: a repository committing a regular CLAUDE.md, turned into a link on one
    machine (an uncommitted type change), had that machine's imports retire the memories
    the team imports from the file, and the team's write them again, in turn."""
    repo = git_repo(tmp_path / "sprockets")
    git(repo, "remote", "add", "origin", "git@github.com:acme/sprockets.git")
    write(repo / "AGENTS.md", "# Build\nRun make.\n")
    write(repo / "CLAUDE.md", "# Review\nTwo approvals.\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "both files")
    summary(relay_import(server, repo, "."))
    (team,) = live_memories(server, "acme/sprockets/CLAUDE.md")
    (repo / "CLAUDE.md").unlink()
    (repo / "CLAUDE.md").symlink_to("AGENTS.md")  # this machine only: git records a file
    done = relay_import(server, repo, ".")
    assert summary(done) == "imported 1 memory: 0 new or changed, 1 unchanged, 0 retired"
    assert live_memories(server, "acme/sprockets/CLAUDE.md") == [team]
    git(repo, "add", "CLAUDE.md")
    git(repo, "commit", "-q", "-m", "CLAUDE.md is a link now")  # the team's: retired
    done = relay_import(server, repo, ".")
    assert summary(done) == "imported 1 memory: 0 new or changed, 1 unchanged, 1 retired"
    assert live_memories(server, "acme/sprockets/CLAUDE.md") == []


def test_reimport_from_another_folder_is_idempotent(tmp_path, server):
    repo = git_repo(tmp_path / "qa1-proj")
    write(repo / "AGENTS.md", "# Build\nRun make.\n\n# Test\nRun pytest.\n")
    write(repo / "docs" / "deploy.md", "# Deploy\nTag from main.\n")
    first = relay_import(server, repo, "AGENTS.md", "docs")
    assert summary(first) == "imported 3 memories: 3 new or changed, 0 unchanged, 0 retired"

    for cwd, args in (
        (tmp_path, ["qa1-proj/AGENTS.md", "qa1-proj/docs/deploy.md"]),
        (repo / "docs", ["../AGENTS.md", "deploy.md"]),
        (Path("/"), [str(repo / "AGENTS.md"), str(repo / "docs")]),
    ):
        again = relay_import(server, cwd, *args)
        assert summary(again) == "imported 3 memories: 0 new or changed, 3 unchanged, 0 retired", (
            cwd
        )

    assert len(live_memories(server, "qa1-proj/AGENTS.md")) == 2
    assert [m["revision"] for m in live_memories(server, "qa1-proj/docs/deploy.md")] == [1]


def test_a_symlinked_claude_md_imported_alone_is_its_target(tmp_path, server):
    """QA: with CLAUDE.md -> AGENTS.md, `relay import .` made each section once, but
    `relay import CLAUDE.md` made a second copy of each under acme/widgets/CLAUDE.md."""
    repo = git_repo(tmp_path / "widgets")
    subprocess.run(
        ["git", "-C", str(repo), "remote", "add", "origin", "git@github.com:acme/widgets.git"],
        check=True,
    )
    write(repo / "AGENTS.md", "# Build\nRun make.\n\n# Test\nRun pytest.\n")
    (repo / "CLAUDE.md").symlink_to("AGENTS.md")
    done = relay_import(server, repo, ".")
    assert summary(done) == "imported 2 memories: 2 new or changed, 0 unchanged, 0 retired"
    for args in (["CLAUDE.md"], ["CLAUDE.md", "AGENTS.md"], ["AGENTS.md"]):
        again = relay_import(server, repo, *args)
        assert summary(again) == "imported 2 memories: 0 new or changed, 2 unchanged, 0 retired"
    assert bodies(server, "acme/widgets/AGENTS.md") == ["Run make.", "Run pytest."]
    assert bodies(server, "acme/widgets/CLAUDE.md") == []


def test_memories_under_a_links_own_name_are_retired_once_it_is_named_by_its_target(
    tmp_path, server
):
    """QA: memories imported under CLAUDE.md's own name (a copy of AGENTS.md then, or an
    import through the link by an older release) were never retired once the link was
    named by its target: its path exists, so nothing retired it, and after AGENTS.md
    changed the stale copy came back in recall above the current text."""
    repo = git_repo(tmp_path / "gizmos")
    git(repo, "remote", "add", "origin", "git@github.com:acme/gizmos.git")
    agents = write(repo / "AGENTS.md", "# Build\nRun make.\n")
    write(repo / "CLAUDE.md", "# Build\nRun make.\n")  # a copy, before the link
    outside = write(tmp_path / "shared" / "CLAUDE.md", "# Review\nTwo approvals.\n")
    (repo / "docs").mkdir()
    (repo / "docs" / "CLAUDE.md").symlink_to(outside)  # leads out: keeps its own name
    write(repo / "api" / "CLAUDE.md", "# Build\nRun make.\n")  # a regular file, same text
    summary(relay_import(server, repo, "."))
    (stale,) = live_memories(server, "acme/gizmos/CLAUDE.md")
    (kept,) = live_memories(server, "acme/gizmos/AGENTS.md")

    (repo / "CLAUDE.md").unlink()
    (repo / "CLAUDE.md").symlink_to("AGENTS.md")
    agents.write_text("# Build\nRun make ci.\n", encoding="utf-8")
    done = relay_import(server, repo, ".")
    assert summary(done) == "imported 3 memories: 1 new or changed, 2 unchanged, 1 retired"
    assert (
        "relay: note: acme/gizmos/CLAUDE.md leads to acme/gizmos/AGENTS.md and is named by it"
        " now: the memory imported under its own name was retired (acme/gizmos/AGENTS.md's"
        " hold its text)"
    ) in done.stderr, done.stderr
    assert history(server, stale["id"]) == ["create", "delete"]
    assert [(m["id"], m["body"]) for m in live_memories(server, "acme/gizmos/AGENTS.md")] == [
        (kept["id"], "Run make ci.")
    ]
    assert bodies(server, "acme/gizmos/docs/CLAUDE.md") == ["Two approvals."]
    assert bodies(server, "acme/gizmos/api/CLAUDE.md") == ["Run make."]

    # Imported through the link alone by an older release: the file import retires it too.
    old = imported_by_hand(server, "imp_" + "0" * 16, "Run make.", "acme/gizmos/CLAUDE.md")
    by_hand = remember(server, body="CLAUDE.md is a link.", source="acme/gizmos/CLAUDE.md")
    done = relay_import(server, repo, "CLAUDE.md")
    assert summary(done) == "imported 1 memory: 0 new or changed, 1 unchanged, 1 retired"
    assert history(server, old["id"]) == ["create", "delete"]
    assert bodies(server, "acme/gizmos/CLAUDE.md") == ["CLAUDE.md is a link."]
    assert history(server, by_hand["id"]) == ["create"]
    # --keep-removed keeps them, as it keeps every other retired section.
    again = imported_by_hand(server, "imp_" + "1" * 16, "Run make.", "acme/gizmos/CLAUDE.md")
    kept_again = relay_import(server, repo, "--keep-removed", "CLAUDE.md")
    assert summary(kept_again).endswith(", 0 retired")
    assert history(server, again["id"]) == ["create"]


def imported_by_hand(server, memory_id: str, body: str, source: str) -> dict:
    """A memory as an import by an older release wrote it (an importer's id)."""
    item = {"id": memory_id, "body": body, "title": "Build", "source": source, "tags": []}
    written = httpx.post(
        f"{server.url}/v1/memories/batch",
        json={"items": [item]},
        headers={"Authorization": f"Bearer {server.admin_key}"},
        timeout=30,
    )
    assert written.status_code == 200, written.text
    return item


def test_source_prefix_names_the_repository(tmp_path, server):
    clone = git_repo(tmp_path / "my-checkout")
    write(clone / "CLAUDE.md", "# Release\nShip on Tuesdays.\n")
    done = relay_import(server, clone, "--source-prefix", "billing", "CLAUDE.md")
    assert summary(done) == "imported 1 memory: 1 new or changed, 0 unchanged, 0 retired"
    assert [m["body"] for m in live_memories(server, "billing/CLAUDE.md")] == ["Ship on Tuesdays."]
    assert live_memories(server, "my-checkout/CLAUDE.md") == []
    assert "no origin remote" not in done.stderr


def test_a_repository_named_by_its_folder_alone_is_warned_about_once(tmp_path, server):
    """Two repositories without an origin, in folders of the same name, share sources, and
    importing one overwrites and retires the other's memories: say so, once per repository,
    before anything is written."""
    repo = git_repo(tmp_path / "a" / "shop")
    write(repo / "AGENTS.md", "# Build\nRun make.\n")
    write(repo / "docs" / "deploy.md", "# Deploy\nTag from main.\n")
    done = relay_import(server, repo, "AGENTS.md", "docs")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("has no origin remote") == 1, done.stderr
    assert "(shop/...)" in done.stderr and "--source-prefix" in done.stderr
    subprocess.run(
        ["git", "-C", str(repo), "remote", "add", "origin", "git@example.com:acme/shop.git"],
        check=True,
    )
    named = relay_import(server, repo, "AGENTS.md")
    assert "no origin remote" not in named.stderr
    assert [m["body"] for m in live_memories(server, "acme/shop/AGENTS.md")] == ["Run make."]


def placed(path: Path) -> str:
    """The source of a file outside any git work tree and outside HOME: its absolute path."""
    return f"{os.path.realpath(path.parent)}/{path.name}"


def test_files_outside_git_keep_apart_whatever_the_folder(tmp_path, server):
    """QA: outside a git work tree sources were relative to the working directory (or just
    the file's name): projB's CLAUDE.md overwrote projA's, importing y/notes.md from z
    retired x/notes.md's memory, and x/notes.md from its parent became a second copy."""
    home = tmp_path / "home"
    home.mkdir()
    t = tmp_path / "t"
    a = write(t / "projA" / "CLAUDE.md", "# Build\n\nProject A builds with gradle.\n")
    b = write(t / "projB" / "CLAUDE.md", "# Build\n\nProject B builds with cargo.\n")
    x = write(t / "x" / "notes.md", "# A\n\nFact x.\n")
    y = write(t / "y" / "notes.md", "# B\n\nFact y.\n")
    (t / "z").mkdir()
    new = "imported 1 memory: 1 new or changed, 0 unchanged, 0 retired"
    assert summary(relay_import(server, t / "projA", "CLAUDE.md", home=home)) == new
    assert summary(relay_import(server, t / "projB", "CLAUDE.md", home=home)) == new
    assert summary(relay_import(server, t / "z", str(x), home=home)) == new
    done = relay_import(server, t / "z", str(y), home=home)
    assert summary(done) == new
    assert "outside any git work tree" in done.stderr and placed(y) in done.stderr
    assert "--root FOLDER --source-prefix NAME" in done.stderr
    again = relay_import(server, t, "x/notes.md", "projA/CLAUDE.md", home=home)
    assert summary(again) == "imported 2 memories: 0 new or changed, 2 unchanged, 0 retired"

    (gradle,), (cargo,) = live_memories(server, placed(a)), live_memories(server, placed(b))
    assert (gradle["body"], gradle["revision"]) == ("Project A builds with gradle.", 1)
    assert (cargo["body"], cargo["revision"]) == ("Project B builds with cargo.", 1)
    assert [m["body"] for m in live_memories(server, placed(x))] == ["Fact x."]
    assert [m["body"] for m in live_memories(server, placed(y))] == ["Fact y."]
    assert not [m for m in every_memory(server) if m["source"] in ("CLAUDE.md", "notes.md")]


def test_a_file_under_home_is_named_from_home(tmp_path, server):
    home = tmp_path / "me"
    notes = write(home / "notes" / "AGENTS.md", "# Style\nUse black.\n")
    first = relay_import(server, home / "notes", "AGENTS.md", home=home)
    assert summary(first) == "imported 1 memory: 1 new or changed, 0 unchanged, 0 retired"
    assert "(~/notes/AGENTS.md)" in first.stderr  # warned: another home differs
    again = relay_import(server, tmp_path, str(notes), home=home)
    assert summary(again) == "imported 1 memory: 0 new or changed, 1 unchanged, 0 retired"
    assert [m["body"] for m in live_memories(server, "~/notes/AGENTS.md")] == ["Use black."]
    named = relay_import(
        server, tmp_path, "--root", str(home), "--source-prefix", "team", str(notes), home=home
    )
    assert "outside any git work tree" not in named.stderr
    assert [m["body"] for m in live_memories(server, "team/notes/AGENTS.md")] == ["Use black."]


def test_two_files_recorded_under_one_source_are_refused(tmp_path, server):
    """Two repositories given one --source-prefix (or two remote-less ones in folders of
    one name) would share sources: in one import, the second file's memories replaced the
    first's. Nothing is written."""
    one = write(git_repo(tmp_path / "a" / "qa-shop") / "AGENTS.md", "# Build\nRun make.\n")
    two = write(git_repo(tmp_path / "b" / "qa-shop") / "AGENTS.md", "# Build\nRun cargo.\n")
    for args in (["--source-prefix", "qa-same", str(one), str(two)], [str(one), str(two)]):
        done = relay_import(server, tmp_path, *args)
        assert done.returncode == 2, done.stdout
        source = "qa-same/AGENTS.md" if args[0] == "--source-prefix" else "qa-shop/AGENTS.md"
        assert done.stderr.startswith(
            f"relay: error: {one} and {two} would both be recorded as {source}, and importing"
            " one would overwrite and retire the other's memories; nothing was imported"
        )
        assert live_memories(server, source) == []


# --- a rejected section --------------------------------------------------------------------

GITHUB_TOKEN = "gh" + "p_" + "Zy9Xw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa"


def test_secret_names_file_and_section_and_nothing_is_stored(tmp_path, server):
    repo = git_repo(tmp_path / "qa3-proj")
    # Enough sections that the bad one would travel in the second batch of 128.
    write(repo / "AGENTS.md", "".join(f"# Rule {i}\nKeep rule {i}.\n\n" for i in range(140)))
    write(
        repo / "CLAUDE.md",
        f"# Ops\n## Deploy\nmake ship\n## CI token\nGITHUB_TOKEN={GITHUB_TOKEN}\n",
    )

    done = relay_import(server, repo, "AGENTS.md", "CLAUDE.md")
    assert done.returncode == 2
    assert done.stderr.startswith(
        "relay: error: qa3-proj/CLAUDE.md › Ops › CI token: "
        "memory looks like it contains a secret (github token);"
    )
    assert live_memories(server, "qa3-proj/AGENTS.md") == []
    assert live_memories(server, "qa3-proj/CLAUDE.md") == []


def test_a_secret_in_a_heading_is_refused_without_printing_it(tmp_path, server):
    """QA: a token pasted into a heading was refused as a secret title, and the refusal
    named the section by that title, printing the token into the terminal and CI log."""
    repo = git_repo(tmp_path / "qa-heading")
    write(repo / "CLAUDE.md", f"# Ops\n## Deploy\nmake ship\n## CI uses {GITHUB_TOKEN}\nin CI.\n")

    done = relay_import(server, repo, "CLAUDE.md")
    assert done.returncode == 2
    assert done.stderr.startswith(
        "relay: error: qa-heading/CLAUDE.md › part 2: "
        "title looks like it contains a secret (github token);"
    )
    assert GITHUB_TOKEN not in done.stderr + done.stdout
    assert live_memories(server, "qa-heading/CLAUDE.md") == []


def test_a_refusal_only_the_server_can_judge_names_the_file_and_section(tmp_path, server):
    """QA: an audience no key holds is the server's to judge, in a batch, and the refusal
    named the section as the batch's `items.0`, which means nothing to whoever ran it."""
    repo = git_repo(tmp_path / "qa-unknown")
    write(repo / "CLAUDE.md", "# Ops\nmake ship\n")

    done = relay_import(server, repo, "--audience", "nosuch", "CLAUDE.md")
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        "relay: error: qa-unknown/CLAUDE.md › Ops: unknown audience: nosuch (no live key"
    ), done.stderr
    assert live_memories(server, "qa-unknown/CLAUDE.md") == []


def test_a_file_name_an_older_release_stored_with_a_bidi_control_imports_again(tmp_path, server):
    """QA: a file whose name holds a bidi control (U+202E), imported by an older release
    before such names were refused, could not be imported again until renamed, though the
    server keeps a value its memory holds. Its sections update their memories; a new one,
    which the server would refuse as a new memory, is refused before anything is written,
    saying what to do."""
    import sqlite3

    from relay.importer import draft_id

    repo = git_repo(tmp_path / "qa-bidi-name")
    name = "ops/\u202efdp.md"
    legacy = f"qa-bidi-name/{name}"
    runbook = write(repo / name, "# Ops\nFreeze at noon.\n")
    memory_id = draft_id(legacy, ("Ops",))
    item = {"id": memory_id, "title": "Ops", "body": "Freeze at noon.", "tags": []}
    written = httpx.post(
        f"{server.url}/v1/memories/batch",
        json={"items": [{**item, "source": "qa-bidi-name/ops/fdp.md"}]},
        headers={"Authorization": f"Bearer {server.admin_key}"},
        timeout=30,
    )
    assert written.status_code == 200, written.text
    with sqlite3.connect(server.db) as conn:  # beneath the API, as an older release left it
        conn.execute("UPDATE memories SET source = ? WHERE id = ?", (legacy, memory_id))
    conn.close()

    done = relay_import(server, repo, name)
    assert summary(done) == "imported 1 memory: 0 new or changed, 1 unchanged, 0 retired"
    runbook.write_text("# Ops\nFreeze at one.\n", encoding="utf-8")
    done = relay_import(server, repo, name)
    assert summary(done) == "imported 1 memory: 1 new or changed, 0 unchanged, 0 retired"

    runbook.write_text("# Ops\nFreeze at two.\n\n# CI\nRun make.\n", encoding="utf-8")
    done = relay_import(server, repo, name)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(
        "relay: error: 'qa-bidi-name/ops/\\u202efdp.md' › CI: source contains U+202E ("
    ), done.stderr
    assert "this section would be a new memory" in done.stderr
    assert done.stderr.endswith(" rename the file (or the folder holding it) and import it again\n")
    (memory,) = live_memories(server, legacy)
    assert (memory["id"], memory["body"], memory["revision"]) == (memory_id, "Freeze at one.", 2)


# --- sections removed from a file ------------------------------------------------------------

AGENTS = "# Build\nRun make.\n\n# Test\nRun pytest.\n\n# Deploy\nTag from main.\n"


def remember(server, **fields) -> dict:
    response = httpx.post(
        f"{server.url}/v1/memories",
        json=fields,
        headers={"Authorization": f"Bearer {server.admin_key}"},
        timeout=30,
    )
    assert response.status_code == 201, response.text
    return response.json()


def history(server, memory_id: str) -> list[str]:
    response = httpx.get(
        f"{server.url}/v1/memories/{memory_id}/revisions",
        headers={"Authorization": f"Bearer {server.admin_key}"},
        timeout=30,
    )
    return [r["action"] for r in response.json()["items"]]


def bodies(server, source: str) -> list[str]:
    return sorted(m["body"] for m in live_memories(server, source))


def test_reimport_retires_only_that_files_removed_sections(tmp_path, server):
    repo = git_repo(tmp_path / "qa2-proj")
    agents = write(repo / "AGENTS.md", AGENTS)
    other = write(repo / "docs" / "other.md", "# Other\nKeep me.\n")
    summary(relay_import(server, repo, "AGENTS.md", "docs/other.md"))
    by_hand = remember(server, body="Deploys need two approvals.", source="qa2-proj/AGENTS.md")
    (deploy,) = [m for m in live_memories(server, "qa2-proj/AGENTS.md") if m["title"] == "Deploy"]

    agents.write_text(AGENTS.replace("# Deploy\nTag from main.\n", ""), encoding="utf-8")
    other.write_text("", encoding="utf-8")  # not named below, so not touched
    done = relay_import(server, tmp_path, "qa2-proj/AGENTS.md")
    assert summary(done) == "imported 2 memories: 0 new or changed, 2 unchanged, 1 retired"

    assert bodies(server, "qa2-proj/AGENTS.md") == [
        "Deploys need two approvals.",
        "Run make.",
        "Run pytest.",
    ]
    assert history(server, deploy["id"]) == ["create", "delete"]
    assert history(server, by_hand["id"]) == ["create"]
    assert bodies(server, "qa2-proj/docs/other.md") == ["Keep me."]

    # Named now, the emptied file loses its memory too.
    done = relay_import(server, repo, "docs/other.md")
    assert summary(done) == "imported 0 memories: 0 new or changed, 0 unchanged, 1 retired"
    assert bodies(server, "qa2-proj/docs/other.md") == []


def test_keep_removed_keeps_them(tmp_path, server):
    repo = git_repo(tmp_path / "qa2-keep")
    agents = write(repo / "AGENTS.md", AGENTS)
    summary(relay_import(server, repo, "AGENTS.md"))
    agents.write_text("# Build\nRun make.\n", encoding="utf-8")
    done = relay_import(server, repo, "--keep-removed", "AGENTS.md")
    assert summary(done) == "imported 1 memory: 0 new or changed, 1 unchanged, 0 retired"
    assert bodies(server, "qa2-keep/AGENTS.md") == ["Run make.", "Run pytest.", "Tag from main."]


def test_a_retired_section_can_come_back(tmp_path, server):
    repo = git_repo(tmp_path / "qa2-back")
    agents = write(repo / "AGENTS.md", AGENTS)
    summary(relay_import(server, repo, "AGENTS.md"))
    (deploy,) = [m for m in live_memories(server, "qa2-back/AGENTS.md") if m["title"] == "Deploy"]
    agents.write_text(AGENTS.replace("# Deploy\nTag from main.\n", ""), encoding="utf-8")
    summary(relay_import(server, repo, "AGENTS.md"))

    agents.write_text(AGENTS, encoding="utf-8")
    done = relay_import(server, repo, "AGENTS.md")
    assert summary(done) == (
        "imported 3 memories: 1 new or changed, 2 unchanged, 0 retired; 1 deleted before (or"
        " hidden from this key) was imported again"
    )
    (back,) = [m for m in live_memories(server, "qa2-back/AGENTS.md") if m["title"] == "Deploy"]
    assert back["id"] == deploy["id"] + ".2"

    again = relay_import(server, repo, "AGENTS.md")
    assert summary(again) == "imported 3 memories: 0 new or changed, 3 unchanged, 0 retired"
    agents.write_text(AGENTS.replace("# Deploy\nTag from main.\n", ""), encoding="utf-8")
    gone = relay_import(server, repo, "AGENTS.md")
    assert summary(gone) == "imported 2 memories: 0 new or changed, 2 unchanged, 1 retired"


def test_a_file_imported_for_an_audience_this_key_lacks_comes_back_beside_it(tmp_path, server):
    """QA (second pass): a teammate without the role got 'no memory imp_89834ac2912c4962';
    then a refusal naming the file, where a section retired for that audience took the
    next generation: the import told a hidden live section from a retired one. The server
    answers both alike (the id is taken), and so both take the next generation; a key that
    reads both generations keeps the oldest and retires the other."""

    def mint(name: str, roles: list[str]) -> str:
        made = httpx.post(
            f"{server.url}/v1/keys",
            json={"name": name, "scopes": ["memory:read", "memory:write"], "roles": roles},
            headers={"Authorization": f"Bearer {server.admin_key}"},
            timeout=30,
        )
        assert made.status_code == 201, made.text
        return made.json()["secret"]

    ops, dev = mint("ops bot", ["ops"]), mint("dev", [])
    repo = git_repo(tmp_path / "qa2-ops")
    write(repo / "docs" / "ops.md", "# Paging\nPage the on-call.\n# Rollback\nRevert the tag.\n")
    summary(relay_import(server, repo, "--audience", "ops", "docs/ops.md", key=ops))
    first = {m["id"]: m["audiences"] for m in live_memories(server, "qa2-ops/docs/ops.md")}
    done = relay_import(server, repo, "docs/ops.md", key=dev)
    assert summary(done) == (
        "imported 2 memories: 2 new or changed, 0 unchanged, 0 retired; 2 deleted before (or"
        " hidden from this key) were imported again"
    )
    both = {m["id"]: m["audiences"] for m in live_memories(server, "qa2-ops/docs/ops.md")}
    assert both == {**first, **{f"{mid}.2": ["all"] for mid in first}}
    again = relay_import(server, repo, "docs/ops.md", key=dev)
    assert summary(again) == "imported 2 memories: 0 new or changed, 2 unchanged, 0 retired"

    back = relay_import(server, repo, "--audience", "ops", "docs/ops.md", key=ops)
    assert summary(back) == "imported 2 memories: 0 new or changed, 2 unchanged, 2 retired"
    assert {m["id"]: m["audiences"] for m in live_memories(server, "qa2-ops/docs/ops.md")} == first


def test_importing_again_without_audience_keeps_each_memorys_audiences(tmp_path, server):
    """Found beside QA's: a file imported with --audience ops and imported again without it
    (by the same ops key, or CI's) was opened to everyone, as was a memory narrowed by hand
    with relay edit --audience. Without --audience a memory keeps its audiences."""
    from integration_support import mint, relay

    ops = mint(server.url, server.admin_key, "ops", ["memory:read", "memory:write"], ["ops"])
    repo = git_repo(tmp_path / "qa-aud")
    write(repo / "ops.md", "# Paging\nPage the on-call.\n")
    write(repo / "AGENTS.md", "# Build\nRun make.\n# Deploy\nTag from main.\n")
    summary(relay_import(server, repo, "--audience", "ops", "ops.md", key=ops["secret"]))
    summary(relay_import(server, repo, "AGENTS.md"))
    (deploy,) = [m for m in live_memories(server, "qa-aud/AGENTS.md") if m["title"] == "Deploy"]
    env = {"RELAY_URL": server.url, "RELAY_API_KEY": server.admin_key}
    assert relay(tmp_path, "edit", deploy["id"], "--audience", "ops", **env).returncode == 0

    done = relay_import(server, repo, "ops.md", "AGENTS.md", key=ops["secret"])
    assert summary(done) == "imported 3 memories: 0 new or changed, 3 unchanged, 0 retired"
    audiences = {
        m["title"]: m["audiences"]
        for m in live_memories(server, "qa-aud/ops.md") + live_memories(server, "qa-aud/AGENTS.md")
    }
    assert audiences == {"Paging": ["ops"], "Build": ["all"], "Deploy": ["ops"]}
    # --audience, given, is for every memory the import writes
    done = relay_import(server, repo, "--audience", "all", "ops.md", key=ops["secret"])
    assert summary(done) == "imported 1 memory: 1 new or changed, 0 unchanged, 0 retired"
    assert [m["audiences"] for m in live_memories(server, "qa-aud/ops.md")] == [["all"]]


def test_an_import_for_audiences_this_key_cannot_read_is_refused(tmp_path, server):
    """QA: a dev key ran `relay import RUNBOOK.md --audience sre` twice and ended with
    imp_x and imp_x.2, and each run added another copy: the key could not read what it
    wrote, so the next import found no section of the file to continue (the server answers
    such an id as taken, no more). The import is refused before anything is written; with
    an audience the key reads among them, or by an admin key, it stays in step."""
    from integration_support import mint

    every = ["memory:read", "memory:write"]
    dev = mint(server.url, server.admin_key, "dev", every, ["dev"])["secret"]
    mint(server.url, server.admin_key, "sre", every, ["sre"])
    repo = git_repo(tmp_path / "qa-runbook")
    write(repo / "RUNBOOK.md", "# Paging\nPage the on-call.\n# Rollback\nRevert the tag.\n")
    for _ in range(2):
        done = relay_import(server, repo, "--audience", "sre", "RUNBOOK.md", key=dev)
        assert (done.returncode, done.stdout) == (3, ""), done.stderr
        assert done.stderr == (
            "relay: error: this key cannot import for sre: it reads all, dev, so it could not"
            " read these memories back, and every later import of the file would write another"
            " copy of each section instead of updating or retiring it; nothing was imported."
            " Import it with a key that reads sre, or with an admin key\n"
        )
    assert live_memories(server, "qa-runbook/RUNBOOK.md") == []

    both = ("--audience", "sre", "--audience", "DEV", "RUNBOOK.md")
    assert summary(relay_import(server, repo, *both, key=dev)).endswith(
        "2 new or changed, 0 unchanged, 0 retired"
    )
    assert summary(relay_import(server, repo, *both, key=dev)).endswith(
        "0 new or changed, 2 unchanged, 0 retired"
    )
    write(repo / "OPS.md", "# Escalation\nCall the lead.\n")
    for _ in range(2):
        summary(relay_import(server, repo, "--audience", "sre", "OPS.md"))  # the admin's
    (ops,) = live_memories(server, "qa-runbook/OPS.md")
    assert (ops["audiences"], ops["revision"]) == (["sre"], 1)


def test_a_section_retired_for_an_audience_this_key_lacks_comes_back_beside_it(tmp_path, server):
    """A section imported for `ops` and retired leaves a tombstone only ops may see; a key
    without the role importing that section again was told 409 'cannot be reused' (it
    could not see the tombstone to step past it). It now takes the next generation."""
    made = httpx.post(
        f"{server.url}/v1/keys",
        json={"name": "ops bot", "scopes": ["memory:read", "memory:write"], "roles": ["ops"]},
        headers={"Authorization": f"Bearer {server.admin_key}"},
        timeout=30,
    )
    ops = made.json()["secret"]
    made = httpx.post(
        f"{server.url}/v1/keys",
        json={"name": "dev", "scopes": ["memory:read", "memory:write"]},
        headers={"Authorization": f"Bearer {server.admin_key}"},
        timeout=30,
    )
    dev = made.json()["secret"]
    repo = git_repo(tmp_path / "qa7-ops")
    notes = write(repo / "notes.md", "# Rollback\nRevert the tag.\n")
    summary(relay_import(server, repo, "--audience", "ops", "notes.md", key=ops))
    (first,) = [m["id"] for m in live_memories(server, "qa7-ops/notes.md")]
    notes.write_text("", encoding="utf-8")
    assert summary(relay_import(server, repo, "notes.md", key=ops)).endswith("1 retired")
    notes.write_text("# Rollback\nRevert the tag.\n", encoding="utf-8")
    done = relay_import(server, repo, "notes.md", key=dev)
    assert done.returncode == 0, done.stderr
    assert [m["id"] for m in live_memories(server, "qa7-ops/notes.md")] == [first + ".2"]


def test_importing_a_folder_retires_the_files_gone_from_it(tmp_path, server):
    """QA (second pass): after `mv docs/runbook.md docs/ops.md`, `relay import docs/` kept
    the runbook's memories beside the new file's, and naming the old path was refused."""
    repo = git_repo(tmp_path / "qa2-folder")
    runbook = write(repo / "docs" / "runbook.md", "# Paging\nPage the on-call.\n")
    write(repo / "docs" / "guide.md", "# Style\nUse black.\n")
    write(repo / "docs" / "deploy.md", "# Deploy\nTag from main.\n")
    hidden = write(repo / "docs" / ".private" / "notes.md", "# Keys\nAsk IT.\n")
    git(repo, "add", "docs")
    git(repo, "commit", "-q", "-m", "docs")
    summary(relay_import(server, repo, "docs", str(hidden)))
    by_hand = remember(server, body="Runbooks live in docs.", source="qa2-folder/docs/runbook.md")

    runbook.rename(repo / "docs" / "ops.md")  # not committed yet: the work tree says so
    git(repo, "rm", "-q", "docs/deploy.md")
    git(repo, "commit", "-q", "-m", "no deploy notes")  # deleted by a commit
    done = relay_import(server, repo, "docs")
    assert summary(done) == "imported 2 memories: 1 new or changed, 1 unchanged, 2 retired"
    assert bodies(server, "qa2-folder/docs/runbook.md") == ["Runbooks live in docs."]
    assert bodies(server, "qa2-folder/docs/deploy.md") == []
    assert bodies(server, "qa2-folder/docs/ops.md") == ["Page the on-call."]
    assert history(server, by_hand["id"]) == ["create"]
    # still on disk, only not walked (a hidden folder): kept
    assert bodies(server, "qa2-folder/docs/.private/notes.md") == ["Ask IT."]
    # --keep-removed keeps a gone file's memories too
    (repo / "docs" / "guide.md").unlink()
    kept = relay_import(server, repo, "--keep-removed", "docs")
    assert summary(kept) == "imported 1 memory: 0 new or changed, 1 unchanged, 0 retired"
    assert bodies(server, "qa2-folder/docs/guide.md") == ["Use black."]


def test_a_folder_with_no_file_left_still_retires_those_gone_from_it(tmp_path, server):
    """QA: after `git rm docs/ops-runbook.md`, its last Markdown file, `relay import docs`
    said 'no importable files found' (exit 2) and retired nothing, so recall kept the
    deleted runbook; only `relay import .` retired it. A folder with nothing left to read
    is imported all the same (a CI job importing docs/ succeeds: 0 imported, 1 retired);
    when there is nothing to retire either, it says there is nothing to import."""
    repo = git_repo(tmp_path / "qa-emptied")
    git(repo, "remote", "add", "origin", "git@github.com:acme/qa-emptied-backend.git")
    write(repo / ".gitignore", "*.local.md\n")
    write(repo / "docs" / "ops-runbook.md", "# Paging\nWho gets pages first: the primary.\n")
    write(repo / "docs" / "diagram.svg", "<svg/>\n")  # keeps docs/ in every clone
    write(repo / "docs" / "mine.local.md", "# Mine\nNot for the team.\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "docs")
    summary(relay_import(server, repo, "docs"))
    (runbook,) = live_memories(server, "acme/qa-emptied-backend/docs/ops-runbook.md")

    git(repo, "rm", "-q", "docs/ops-runbook.md")
    git(repo, "commit", "-q", "-m", "runbook moved to the wiki")
    done = relay_import(server, repo, "docs")
    assert summary(done) == (
        "imported 0 memories: 0 new or changed, 0 unchanged, 1 retired; skipped 1 file git ignores"
    )
    assert history(server, runbook["id"]) == ["create", "delete"]

    again = relay_import(server, repo, "docs")
    assert (summary(again), again.stderr) == (
        "nothing to import in docs: no file relay import reads there (skipped 1 file git"
        " ignores), nor memories of files gone from there to retire",
        "",
    )


def test_a_folder_git_deleted_whole_can_be_named_and_retires_its_memories(tmp_path, server):
    """QA: in a repository where docs/ held only ops-runbook.md, `git rm` took docs/ too (git
    keeps no empty folder: a fresh clone in CI has none either), and `relay import docs` said
    "Path 'docs' does not exist" (exit 2): the runbook stayed in recall until `relay import
    .`. A path a git work tree no longer has is a folder gone whole when memories were
    imported from under it: retired as for a folder emptied. Else one line, exit 2."""
    repo = git_repo(tmp_path / "qa-gone-whole")
    git(repo, "remote", "add", "origin", "git@github.com:acme/qa-gone-whole-backend.git")
    write(repo / "README.md", "# Backend\n")
    write(repo / "docs" / "ops-runbook.md", "# Paging\nWho gets pages first: the primary.\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "docs")
    summary(relay_import(server, repo, "docs"))
    (runbook,) = live_memories(server, "acme/qa-gone-whole-backend/docs/ops-runbook.md")

    git(repo, "rm", "-q", "docs/ops-runbook.md")
    git(repo, "commit", "-q", "-m", "runbook moved to the wiki")
    assert not (repo / "docs").exists()
    done = relay_import(server, repo, "docs")
    assert summary(done) == "imported 0 memories: 0 new or changed, 0 unchanged, 1 retired"
    assert history(server, runbook["id"]) == ["create", "delete"]

    # QA: CI runs `relay import docs` on every commit; every run after the one that retired
    # docs/ exited 2, so CI failed forever after a legitimate deletion. Said, exit 0.
    again = relay_import(server, repo, "docs")
    assert (again.returncode, again.stdout, again.stderr) == (
        0,
        "nothing to import in docs: gone, and its memory was retired before (or forgotten)\n",
        "",
    )
    gone = "nor memories imported from it or from under it: nothing to import or retire"
    typo = relay_import(server, repo, "dcos")
    assert (typo.returncode, typo.stdout, typo.stderr) == (
        2,
        "",
        f"relay: error: no such file or folder: dcos, {gone} (see 'relay import --help')\n",
    )
    for args in (("docs", "--keep-removed"), ("--root", ".", "docs")):  # they look for none
        kept = relay_import(server, repo, *args)
        assert (kept.returncode, kept.stderr) == (
            2,
            "relay: error: no such file or folder: docs (see 'relay import --help')\n",
        )
    outside = relay_import(server, tmp_path, "nowhere", home=tmp_path / "home")
    assert (outside.returncode, outside.stderr) == (
        2,
        "relay: error: no such file or folder: nowhere (see 'relay import --help')\n",
    )


def test_a_file_git_deleted_can_be_named_and_retires_its_memories(tmp_path, server):
    """QA: after `relay import SINGLE.md`, then `git rm SINGLE.md` and a commit, `relay import
    SINGLE.md` said "no such file or folder: SINGLE.md, nor memories imported from under
    it" (exit 2) and its memory stayed in recall, though --help says a path a work tree no
    longer has may be named. A file deleted, named, retires its own memories (not those of
    a file whose name starts alike), as a folder's import would."""
    repo = git_repo(tmp_path / "qa-gone-file")
    git(repo, "remote", "add", "origin", "git@github.com:acme/qa-gone-file.git")
    write(repo / "SINGLE.md", "# Deploys\nDeploy from main only.\n")
    write(repo / "SINGLE.md.md", "# Namesake\nStays.\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "single")
    summary(relay_import(server, repo, "SINGLE.md", "SINGLE.md.md"))
    (single,) = live_memories(server, "acme/qa-gone-file/SINGLE.md")
    namesake = live_memories(server, "acme/qa-gone-file/SINGLE.md.md")

    git(repo, "rm", "-q", "SINGLE.md", "SINGLE.md.md")
    git(repo, "commit", "-q", "-m", "deploy notes moved to the wiki")
    done = relay_import(server, repo, "SINGLE.md")
    assert summary(done) == "imported 0 memories: 0 new or changed, 0 unchanged, 1 retired"
    assert history(server, single["id"]) == ["create", "delete"]
    assert live_memories(server, "acme/qa-gone-file/SINGLE.md.md") == namesake

    again = relay_import(server, repo, "SINGLE.md")  # retired before: CI's next run passes
    assert (again.returncode, again.stdout, again.stderr) == (
        0,
        "nothing to import in SINGLE.md: gone, and its memory was retired before (or forgotten)\n",
        "",
    )


def test_outside_git_a_folder_with_no_file_left_names_those_gone_from_it(tmp_path, server):
    """QA: outside git, a folder whose only file was deleted (x/sub/CLAUDE.md, then
    `relay import x`) said 'no importable files found' and never the note that names the
    missing file's memories, still recalled, for relay forget."""
    home = tmp_path / "home"
    home.mkdir()
    old = write(tmp_path / "x" / "sub" / "CLAUDE.md", "# Paging\nPage the on-call.\n")
    summary(relay_import(server, tmp_path, "x", home=home))
    (memory,) = live_memories(server, placed(old))

    old.unlink()
    done = relay_import(server, tmp_path, "x", home=home)
    assert summary(done) == (
        "imported 0 memories: 0 new or changed, 0 unchanged, 0 retired; 1 memory comes from a"
        " file missing outside git, left as it is"
    )
    assert f"relay: note: {placed(old)} is not in its folder on this machine" in done.stderr
    assert f"relay forget ID removes it: {memory['id']}" in done.stderr, done.stderr
    assert live_memories(server, placed(old)) == [memory]
    # Nothing to look for with --root: nothing to do.
    rooted = relay_import(server, tmp_path, "--root", "x", "x", home=home)
    assert summary(rooted) == "nothing to import in x: no file relay import reads there"


def test_a_file_this_checkout_never_had_keeps_its_memories(tmp_path, server):
    """QA: a runbook committed on another branch and imported from there was retired (text
    and all: a delete keeps a tombstone) by `relay import .` on the main branch, where it
    never was. Only a file this branch's history deleted or renamed is retired; one the
    checkout lacks otherwise (another branch's, newer than this clone, left out of a sparse
    checkout) is left as it is, and said."""
    repo = git_repo(tmp_path / "qa-branch")
    write(repo / "AGENTS.md", "# Build\nRun make.\n")
    write(repo / "ops" / "oncall.md", "# Oncall\nPage the secondary after 15 minutes.\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "agents")
    main = git(repo, "symbolic-ref", "--short", "HEAD")
    git(repo, "checkout", "-q", "-b", "old")
    write(repo / "docs" / "runbook.md", "# Paging\nPage the on-call.\n")
    git(repo, "add", "docs")
    git(repo, "commit", "-q", "-m", "runbook")
    summary(relay_import(server, repo, "."))
    (runbook,) = live_memories(server, "qa-branch/docs/runbook.md")

    git(repo, "checkout", "-q", main)
    assert not (repo / "docs" / "runbook.md").exists()
    done = relay_import(server, repo, ".")
    assert summary(done) == (
        "imported 2 memories: 0 new or changed, 2 unchanged, 0 retired; 1 memory comes from a"
        " file this checkout does not have, left as it is"
    )
    assert "qa-branch/docs/runbook.md is not in this checkout" in done.stderr, done.stderr
    assert history(server, runbook["id"]) == ["create"]
    assert bodies(server, "qa-branch/docs/runbook.md") == ["Page the on-call."]

    # A sparse checkout leaving ops/ out has not deleted it either.
    git(repo, "sparse-checkout", "set", "--no-cone", "/AGENTS.md")
    assert not (repo / "ops").exists()
    done = relay_import(server, repo, ".")
    assert summary(done) == (
        "imported 1 memory: 0 new or changed, 1 unchanged, 0 retired; 2 memories come from"
        " files this checkout does not have, left as they are"
    )
    assert bodies(server, "qa-branch/ops/oncall.md") == ["Page the secondary after 15 minutes."]
    git(repo, "sparse-checkout", "disable")

    # Merged, then deleted on this branch: now it is retired.
    git(repo, "merge", "-q", "old")
    git(repo, "rm", "-q", "docs/runbook.md")
    git(repo, "commit", "-q", "-m", "runbook moved to the wiki")
    done = relay_import(server, repo, ".")
    assert summary(done) == "imported 2 memories: 0 new or changed, 2 unchanged, 1 retired"
    assert history(server, runbook["id"]) == ["create", "delete"]


def test_without_git_a_folder_import_retires_no_file_gone_from_it(tmp_path, server):
    """Without git to say which files were deleted, a file missing from the folder may be
    another branch's: its memories are left as they are, and the note says why."""
    repo = git_repo(tmp_path / "qa-nogit")
    write(repo / "AGENTS.md", "# Build\nRun make.\n")
    notes = write(repo / "docs" / "notes.md", "# Notes\nKeep them short.\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "docs")
    summary(relay_import(server, repo, "."))
    notes.unlink()
    empty = tmp_path / "no-git-here"
    empty.mkdir()
    done = relay_import(server, repo, ".", PATH=str(empty))
    assert summary(done) == (
        "imported 1 memory: 0 new or changed, 1 unchanged, 0 retired; 1 memory comes from a"
        " file this checkout does not have, left as it is"
    )
    assert "git could not say whether this branch deleted them (git is not installed)" in (
        done.stderr
    )
    assert bodies(server, "qa-nogit/docs/notes.md") == ["Keep them short."]
    # With git, the deletion is found.
    assert summary(relay_import(server, repo, ".")).endswith(", 1 retired")


def test_outside_git_a_file_gone_from_a_folder_is_counted_and_named_not_retired(tmp_path, server):
    """QA: the help promised that a file missing from a folder outside git keeps its
    memories and is counted in the summary; nothing was counted, so a user never learnt
    that their deleted file's memories were still recalled. They stay (nothing tells a
    deleted file from a moved one there), counted, and a note names the file and the
    ids for relay forget."""
    home = tmp_path / "home"
    home.mkdir()
    notes = tmp_path / "notes"
    write(notes / "keep.md", "# Style\nUse black.\n")
    old = write(notes / "sub" / "old.md", "# Paging\nPage the on-call.\n\n# Pager\nUse PD.\n")
    summary(relay_import(server, tmp_path, "notes", home=home))
    ids = sorted(m["id"] for m in live_memories(server, placed(old)))
    assert len(ids) == 2

    old.unlink()
    done = relay_import(server, tmp_path, "notes", home=home)
    assert summary(done) == (
        "imported 1 memory: 0 new or changed, 1 unchanged, 0 retired; 2 memories come from"
        " files missing outside git, left as they are"
    )
    assert (
        f"relay: note: {placed(old)} is not in its folder on this machine, and outside a git"
        " work tree relay cannot tell a deleted file from one moved, not there yet, or"
        " another machine's (a teammate's ~/ is theirs): its 2 memories"
        " are left as they are, still recalled; if the file was deleted, relay forget ID"
        f" removes each: {ids[0]} {ids[1]}"
    ) in done.stderr, done.stderr
    assert bodies(server, placed(old)) == ["Page the on-call.", "Use PD."]
    # As the note says: forgotten, they are no longer counted.
    for memory_id in ids:
        forgot = subprocess.run(
            [RELAY, "forget", memory_id],
            env=clean_env(home, RELAY_URL=server.url, RELAY_API_KEY=server.admin_key),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert forgot.returncode == 0, forgot.stderr
    again = relay_import(server, tmp_path, "notes", home=home)
    assert summary(again) == "imported 1 memory: 0 new or changed, 1 unchanged, 0 retired"
    assert "is not in its folder" not in again.stderr


# --- what git ignores --------------------------------------------------------------------


def test_a_folder_import_leaves_out_what_git_ignores_and_takes_what_is_named(tmp_path, server):
    """QA: inside a git work tree `relay import .` read every file, so a build's copy of
    the docs and notes git ignores became everyone's memory. A folder's import reads what
    git does not ignore (a tracked file never is) and counts what it skipped; a file named
    is imported as named, and said to be one git ignores. node_modules, never read, is not
    counted, ignored or not (QA: README's example counted it)."""
    repo = git_repo(tmp_path / "gi-walk")
    git(repo, "remote", "add", "origin", "git@github.com:acme/gi-walk.git")
    write(repo / ".gitignore", "build/\ndist/\nnode_modules/\n*.local.md\n")
    write(repo / "AGENTS.md", "# Build\nRun make.\n")
    write(repo / "node_modules" / "left-pad" / "README.md", "# left-pad\nPads.\n")
    write(repo / "build" / "docs" / "AGENTS.md", "# Build\nRun make.\n")
    write(repo / "dist" / "CHANGES.md", "# Changes\nTracked though ignored.\n")
    notes = write(repo / "sp ace" / "ünï notes.local.md", "# Mine\nMy notes.\n")
    write(repo / "sp ace" / "ünï code.md", "# Unicode\nKept.\n")
    git(repo, "add", ".gitignore", "AGENTS.md")
    git(repo, "add", "-f", "dist/CHANGES.md")
    git(repo, "commit", "-q", "-m", "agents")

    done = relay_import(server, repo, ".")
    assert summary(done) == (
        "imported 3 memories: 3 new or changed, 0 unchanged, 0 retired; skipped 1 folder and"
        " 1 file git ignores"
    )
    sources = {m["source"] for m in every_memory(server) if "gi-walk/" in m["source"]}
    assert sources == {
        "acme/gi-walk/AGENTS.md",
        "acme/gi-walk/dist/CHANGES.md",
        "acme/gi-walk/sp ace/ünï code.md",
    }
    assert "git ignores" not in done.stderr, done.stderr

    named = relay_import(server, repo, str(notes))
    assert summary(named) == "imported 1 memory: 1 new or changed, 0 unchanged, 0 retired"
    assert f"relay: note: git ignores {notes}, named here: imported as named" in named.stderr
    assert bodies(server, "acme/gi-walk/sp ace/ünï notes.local.md") == ["My notes."]


def test_a_file_git_ignores_keeps_its_memories_unless_retire_ignored_is_asked(tmp_path, server):
    """A file imported before git ignored it (or before imports followed git's ignore
    rules, or named), still on disk: a folder's import no longer reads it, and must not
    take its memories on that alone (an ignore rule is no deletion); they are counted,
    and --retire-ignored retires them."""
    repo = git_repo(tmp_path / "gi-retire")
    write(repo / "AGENTS.md", "# Build\nRun make.\n")
    write(repo / "notes" / "draft.md", "# Draft\nShip on Friday.\n")
    git(repo, "add", "AGENTS.md")
    git(repo, "commit", "-q", "-m", "agents")
    summary(relay_import(server, repo, "."))  # untracked, not ignored: read
    (draft,) = live_memories(server, "gi-retire/notes/draft.md")

    write(repo / ".gitignore", "notes/\n")
    done = relay_import(server, repo, ".")
    assert summary(done) == (
        "imported 1 memory: 0 new or changed, 1 unchanged, 0 retired; 1 memory comes from a"
        " file git ignores, left as it is; skipped 1 folder git ignores"
    )
    assert live_memories(server, "gi-retire/notes/draft.md") == [draft]

    refused = relay_import(server, repo, ".", "--retire-ignored", "--keep-removed")
    assert refused.returncode == 2, refused.stderr
    assert "--retire-ignored retires what --keep-removed keeps" in refused.stderr
    done = relay_import(server, repo, "--retire-ignored", ".")
    assert summary(done) == (
        "imported 1 memory: 0 new or changed, 1 unchanged, 1 retired; skipped 1 folder git ignores"
    )
    assert history(server, draft["id"]) == ["create", "delete"]


def test_a_folder_holding_only_files_git_ignores_is_not_a_folder_git_ignores(tmp_path, server):
    """QA: after `git rm` of docs/runbook.md, docs/ held only notes.local.md (git ignores
    *.local.md), and `relay import docs` said "git ignores docs, named here: imported as
    named" and imported the personal note into team memory: git lists a folder whose every
    file it ignores as one line (`./`), which was read as the folder ignored as a whole. No
    rule matches docs/: its files git ignores stay out, and the runbook is retired."""
    repo = git_repo(tmp_path / "gi-only-ignored")
    git(repo, "remote", "add", "origin", "git@github.com:acme/gi-only-ignored.git")
    write(repo / ".gitignore", "*.local.md\n")
    write(repo / "docs" / "runbook.md", "# Runbook\nCheck the queue depth dashboard first.\n")
    write(repo / "docs" / "notes.local.md", "# Mine\nMy personal note.\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "docs")
    first = relay_import(server, repo, ".")
    assert summary(first) == (
        "imported 1 memory: 1 new or changed, 0 unchanged, 0 retired; skipped 1 file git ignores"
    )
    (runbook,) = live_memories(server, "acme/gi-only-ignored/docs/runbook.md")

    git(repo, "rm", "-q", "docs/runbook.md")
    git(repo, "commit", "-q", "-m", "runbook moved to the wiki")
    done = relay_import(server, repo, "docs")
    assert summary(done) == (
        "imported 0 memories: 0 new or changed, 0 unchanged, 1 retired; skipped 1 file git ignores"
    )
    assert done.stderr == "", done.stderr
    assert history(server, runbook["id"]) == ["create", "delete"]
    for named in ("docs", "."):
        again = relay_import(server, repo, named)
        assert summary(again).startswith(
            f"nothing to import in {named}: no file relay import reads there (skipped 1 file"
            " git ignores)"
        )
    assert live_memories(server, "acme/gi-only-ignored/docs/notes.local.md") == []


def test_a_file_git_ignores_imported_on_purpose_is_counted_not_noted_again(tmp_path, server):
    """Review: after `relay import CLAUDE.local.md` (a file git ignores, named on purpose),
    every later `relay import .` repeated a note that it is a file git ignores, left as it
    is, and how to retire it: nothing was wrong, the file is there and wanted. The summary
    counts its memory; no note nags about it."""
    repo = git_repo(tmp_path / "gi-named")
    git(repo, "remote", "add", "origin", "git@github.com:acme/gi-named.git")
    write(repo / ".gitignore", "*.local.md\n")
    write(repo / "AGENTS.md", "# Build\nRun make.\n")
    write(repo / "CLAUDE.local.md", "# Mine\nMy sandbox is sbx-7.\n")
    git(repo, "add", ".gitignore", "AGENTS.md")
    git(repo, "commit", "-q", "-m", "agents")
    summary(relay_import(server, repo, "."))
    named = relay_import(server, repo, "CLAUDE.local.md")
    assert summary(named) == "imported 1 memory: 1 new or changed, 0 unchanged, 0 retired"
    assert "relay: note: git ignores CLAUDE.local.md, named here" in named.stderr

    for _ in range(2):
        done = relay_import(server, repo, ".")
        assert summary(done) == (
            "imported 1 memory: 0 new or changed, 1 unchanged, 0 retired; 1 memory comes from a"
            " file git ignores, left as it is; skipped 1 file git ignores"
        )
        assert done.stderr == "", done.stderr
    assert bodies(server, "acme/gi-named/CLAUDE.local.md") == ["My sandbox is sbx-7."]


def test_without_git_a_folder_is_read_whole_and_said(tmp_path, server):
    """Where git cannot say what it ignores (not installed), a folder is read as outside
    git, ignored files included, and a warning says so rather than nothing."""
    repo = git_repo(tmp_path / "gi-nogit")
    write(repo / ".gitignore", "build/\n")
    write(repo / "AGENTS.md", "# Build\nRun make.\n")
    write(repo / "build" / "AGENTS.md", "# Build\nRun make.\n")
    empty = tmp_path / "no-git-here"
    empty.mkdir()
    done = relay_import(server, repo, ".", PATH=str(empty))
    assert summary(done) == "imported 2 memories: 2 new or changed, 0 unchanged, 0 retired"
    assert (
        "relay: warning: git could not say what . ignores (git is not installed): its files"
        " are read as outside git, those it ignores included"
    ) in done.stderr, done.stderr


# --- ids that stay with their section -----------------------------------------------------


def test_removing_a_rule_leaves_the_others_in_their_memories(tmp_path, server):
    """QA: deleting the first of four rules and importing again reported '3 new or changed,
    1 retired': alpha's id now held beta, beta's gamma, and delta's was retired."""
    repo = git_repo(tmp_path / "qa-rules")
    rules = [f"Rule {name}: use tabs." for name in ("alpha", "beta", "gamma", "delta")]
    cursorrules = write(repo / ".cursorrules", "".join(f"- {r}\n" for r in rules))
    summary(relay_import(server, repo, ".cursorrules"))
    before = {m["body"]: m["id"] for m in live_memories(server, "qa-rules/.cursorrules")}

    cursorrules.write_text("".join(f"- {r}\n" for r in rules[1:]), encoding="utf-8")
    done = relay_import(server, repo, ".cursorrules")
    assert summary(done) == "imported 3 memories: 0 new or changed, 3 unchanged, 1 retired"
    after = live_memories(server, "qa-rules/.cursorrules")
    assert {m["body"]: m["id"] for m in after} == {r: before[r] for r in rules[1:]}
    assert all(m["revision"] == 1 for m in after)
    assert history(server, before[rules[0]]) == ["create", "delete"]


def test_namesake_sections_keep_their_own_memories(tmp_path, server):
    """QA: with two `## Testing` sections, removing the first rewrote the second's memory,
    and restoring it flipped the content back: one id's history alternated between them."""
    repo = git_repo(tmp_path / "qa-namesakes")
    both = "## Testing\nUse pytest.\n\n## Testing\nRun the suite in CI.\n"
    guide = write(repo / "AGENTS.md", both)
    summary(relay_import(server, repo, "AGENTS.md"))
    ids = {m["body"]: m["id"] for m in live_memories(server, "qa-namesakes/AGENTS.md")}

    guide.write_text("## Testing\nRun the suite in CI.\n", encoding="utf-8")
    done = relay_import(server, repo, "AGENTS.md")
    assert summary(done) == "imported 1 memory: 0 new or changed, 1 unchanged, 1 retired"
    guide.write_text(both, encoding="utf-8")
    back = relay_import(server, repo, "AGENTS.md")
    assert summary(back) == (
        "imported 2 memories: 1 new or changed, 1 unchanged, 0 retired; 1 deleted before (or"
        " hidden from this key) was imported again"
    )
    now = {m["body"]: m["id"] for m in live_memories(server, "qa-namesakes/AGENTS.md")}
    assert now == {
        "Use pytest.": ids["Use pytest."] + ".2",
        "Run the suite in CI.": ids["Run the suite in CI."],
    }
    assert history(server, ids["Run the suite in CI."]) == ["create"]


def test_an_import_by_an_older_release_is_not_rewritten(tmp_path, server):
    """Rules imported before ids were named by their text carry ids by place: importing the
    unchanged file again changes nothing, and removing a rule retires only its memory."""
    repo = git_repo(tmp_path / "qa-older")
    rules = ["Use tabs.", "Prefer pathlib.", "Keep functions short."]
    cursorrules = write(repo / ".cursorrules", "".join(f"- {r}\n" for r in rules))
    source = "qa-older/.cursorrules"
    by_place = [
        "imp_" + hashlib.sha256(f"{source}\0\0{n}".encode()).hexdigest()[:16] for n in range(3)
    ]
    items = [
        {"id": i, "body": r, "title": None, "source": source, "tags": []}
        for i, r in zip(by_place, rules, strict=True)
    ]
    written = httpx.post(
        f"{server.url}/v1/memories/batch",
        json={"items": items},
        headers={"Authorization": f"Bearer {server.admin_key}"},
        timeout=30,
    )
    assert written.status_code == 200, written.text

    done = relay_import(server, repo, ".cursorrules")
    assert summary(done) == "imported 3 memories: 0 new or changed, 3 unchanged, 0 retired"
    cursorrules.write_text("".join(f"- {r}\n" for r in rules[1:]), encoding="utf-8")
    done = relay_import(server, repo, ".cursorrules")
    assert summary(done) == "imported 2 memories: 0 new or changed, 2 unchanged, 1 retired"
    assert {m["id"]: m["body"] for m in live_memories(server, source)} == dict(
        zip(by_place[1:], rules[1:], strict=True)
    )


# --- memories changed by hand since they were imported ---------------------------------------


def test_hand_edits_and_deletions_undone_by_an_import_are_counted(tmp_path, server):
    """QA: importing the file again silently reverted `relay edit`s of its memories and
    brought back sections deleted with `relay forget` as `<id>.2`. The file is the source of
    truth, so it still does, but says so."""
    from integration_support import relay

    env = {"RELAY_URL": server.url, "RELAY_API_KEY": server.admin_key}
    repo = git_repo(tmp_path / "qa-by-hand")
    agents = write(repo / "AGENTS.md", AGENTS)
    summary(relay_import(server, repo, "AGENTS.md"))
    ids = {m["title"]: m["id"] for m in live_memories(server, "qa-by-hand/AGENTS.md")}
    assert relay(tmp_path, "edit", ids["Build"], "--body", "Run ninja.", **env).returncode == 0
    assert relay(tmp_path, "edit", ids["Test"], "--pinned", **env).returncode == 0
    assert relay(tmp_path, "forget", ids["Deploy"], **env).returncode == 0

    done = relay_import(server, repo, "AGENTS.md")
    assert summary(done) == (
        "imported 3 memories: 3 new or changed, 0 unchanged, 0 retired; 2 edited since they"
        " were imported were overwritten; 1 deleted before (or hidden from this key) was"
        " imported again"
    )
    assert (
        f"relay: note: qa-by-hand/AGENTS.md › Build: edited since this text was imported; the"
        f" file's text replaced the edit (relay history {ids['Build']} shows it)"
    ) in done.stderr
    assert "qa-by-hand/AGENTS.md › Test: edited since this text was imported" in done.stderr
    assert (
        f"relay: note: qa-by-hand/AGENTS.md › Deploy: its id {ids['Deploy']} is taken (its"
        " memory was deleted, by relay forget or when it left the file, or is one this key"
        f" cannot read); imported again as {ids['Deploy']}.2"
    ) in done.stderr
    assert bodies(server, "qa-by-hand/AGENTS.md") == ["Run make.", "Run pytest.", "Tag from main."]

    # a section changed in the file is no surprise
    agents.write_text(AGENTS.replace("Run make.", "Run make -j8."), encoding="utf-8")
    done = relay_import(server, repo, "AGENTS.md")
    assert summary(done) == "imported 3 memories: 1 new or changed, 2 unchanged, 0 retired"
    assert "note:" not in done.stderr


def test_an_edit_made_while_an_import_runs_is_kept_and_named(tmp_path, server):
    """A `relay edit` landing after the import read a memory and before its batch was
    written was undone without a word: the import judged the memory as it read it (its
    text, to count an overwritten edit; its audiences, to keep them), and the batch wrote
    over whatever it held by then, opening a narrowed audience to everyone again. The batch
    now writes a memory only at the revision the import read, and the import names the one
    it left as it is: importing again writes the file over it, as over any edit, counted."""
    from integration_support import mint, relay

    mint(server.url, server.admin_key, "qa-race-sre", ["memory:read"], ["sre"])
    repo = git_repo(tmp_path / "qa-race")
    write(repo / "AGENTS.md", AGENTS)
    summary(relay_import(server, repo, "AGENTS.md"))
    ids = {m["title"]: m["id"] for m in live_memories(server, "qa-race/AGENTS.md")}
    direct = {"RELAY_URL": server.url, "RELAY_API_KEY": server.admin_key}

    def edit_meanwhile() -> None:
        edit = ["edit", ids["Build"], "--body", "Run ninja.", "--audience", "sre"]
        done = relay(tmp_path, *edit, **direct)
        assert done.returncode == 0, done.stderr

    with BatchProxy(server.url, nth=1, act=edit_meanwhile) as proxy:
        env = clean_env(repo, RELAY_URL=proxy.url, RELAY_API_KEY=server.admin_key)
        code, out, err = proxy.run(["import", "AGENTS.md"], env, repo)
    assert code == 0, err
    (build,) = [m for m in live_memories(server, "qa-race/AGENTS.md") if m["title"] == "Build"]
    assert (build["body"], build["audiences"], build["revision"]) == ("Run ninja.", ["sre"], 2)
    assert out.strip() == (
        "imported 3 memories: 0 new or changed, 2 unchanged, 0 retired; 1 changed while this"
        " import ran was left as it is"
    )
    notes = [line for line in err.splitlines() if line.startswith("relay: note:")]
    assert notes == [
        f"relay: note: qa-race/AGENTS.md › Build: changed (relay edit, or another import)"
        f" after this import read it, so left as it is; import again to write the file's"
        f" text over it (relay history {ids['Build']} shows the change)"
    ], err
    done = relay_import(server, repo, "AGENTS.md")
    assert summary(done) == (
        "imported 3 memories: 1 new or changed, 2 unchanged, 0 retired; 1 edited since it was"
        " imported was overwritten"
    )
    (build,) = [m for m in live_memories(server, "qa-race/AGENTS.md") if m["title"] == "Build"]
    assert (build["body"], build["audiences"]) == ("Run make.", ["sre"])


def test_a_section_edited_while_an_import_retires_it_is_kept_and_named(tmp_path, server):
    """QA: a section gone from the file was deleted without a revision check, so a
    teammate's `relay edit` landing after the import read the memory, and before the
    retire, was lost with it. The delete goes at the revision the import read; one edited
    meanwhile is left, named, and counted; importing again retires it as it is then."""
    from integration_support import relay

    repo = git_repo(tmp_path / "qa-retire-race")
    write(repo / "AGENTS.md", AGENTS)
    summary(relay_import(server, repo, "AGENTS.md"))
    ids = {m["title"]: m["id"] for m in live_memories(server, "qa-retire-race/AGENTS.md")}
    write(repo / "AGENTS.md", AGENTS.replace("# Deploy\nTag from main.\n", ""))
    direct = {"RELAY_URL": server.url, "RELAY_API_KEY": server.admin_key}

    def edit_meanwhile() -> None:  # after the import listed the file's memories
        done = relay(tmp_path, "edit", ids["Deploy"], "--body", "Tag from release/*.", **direct)
        assert done.returncode == 0, done.stderr

    with BatchProxy(server.url, nth=1, act=edit_meanwhile) as proxy:
        env = clean_env(repo, RELAY_URL=proxy.url, RELAY_API_KEY=server.admin_key)
        code, out, err = proxy.run(["import", "AGENTS.md"], env, repo)
    assert code == 0, err
    (deploy,) = [
        m for m in live_memories(server, "qa-retire-race/AGENTS.md") if m["title"] == "Deploy"
    ]
    assert (deploy["body"], deploy["revision"]) == ("Tag from release/*.", 2)
    assert out.strip() == (
        "imported 2 memories: 0 new or changed, 2 unchanged, 0 retired; 1 changed while this"
        " import ran was left as it is"
    )
    notes = [line for line in err.splitlines() if line.startswith("relay: note:")]
    assert notes == [
        "relay: note: qa-retire-race/AGENTS.md › Deploy: no longer in the file, but changed"
        " (relay edit, relay forget, or another import) after this import read it, so not"
        " retired; import again to retire it as it is then (relay history"
        f" {ids['Deploy']} shows the change)"
    ], err
    done = relay_import(server, repo, "AGENTS.md")
    assert summary(done) == "imported 2 memories: 0 new or changed, 2 unchanged, 1 retired"
    assert history(server, ids["Deploy"]) == ["create", "edit", "delete"]


# --- structured data -------------------------------------------------------------------------


def test_an_audience_narrowed_away_from_the_importing_key_meanwhile_is_kept(tmp_path, server):
    """Review: a memory narrowed, while an import ran, to a role the importing key lacks
    was refused with the 409 of a memory the key may not read, which names no revision;
    the import took that for a new section's id taken and wrote a new copy at the id's
    next generation, for the wider audiences it had read: what the narrowing hid was open
    to everyone again. A memory the import read live is left as it is, named."""
    from integration_support import mint, relay

    mint(server.url, server.admin_key, "qa-narrow-sre", ["memory:read"], ["sre"])
    dev = mint(server.url, server.admin_key, "qa-narrow-dev", ["memory:read", "memory:write"])
    repo = git_repo(tmp_path / "qa-narrow")
    write(repo / "AGENTS.md", AGENTS)
    summary(relay_import(server, repo, "AGENTS.md", key=dev["secret"]))
    ids = {m["title"]: m["id"] for m in live_memories(server, "qa-narrow/AGENTS.md")}
    direct = {"RELAY_URL": server.url, "RELAY_API_KEY": server.admin_key}

    def narrow_meanwhile() -> None:
        done = relay(tmp_path, "edit", ids["Build"], "--audience", "sre", **direct)
        assert done.returncode == 0, done.stderr

    with BatchProxy(server.url, nth=1, act=narrow_meanwhile) as proxy:
        env = clean_env(repo, RELAY_URL=proxy.url, RELAY_API_KEY=dev["secret"])
        code, out, err = proxy.run(["import", "AGENTS.md"], env, repo)
    assert code == 0, err
    builds = [m for m in live_memories(server, "qa-narrow/AGENTS.md") if m["title"] == "Build"]
    assert [(m["id"], m["audiences"], m["revision"]) for m in builds] == [
        (ids["Build"], ["sre"], 2)
    ]
    assert out.strip() == (
        "imported 3 memories: 0 new or changed, 2 unchanged, 0 retired; 1 changed while this"
        " import ran was left as it is"
    )
    assert f"relay history {ids['Build']} shows the change" in err


def test_an_export_file_is_refused_and_nothing_is_written(tmp_path, server):
    """QA: `relay import memories-backup.jsonl` printed `imported 2 memories`, and a reader
    key then found the payments-only memory in the raw JSONL, stored for everyone."""
    from integration_support import mint, relay

    mint(server.url, server.admin_key, "payments dev", ["memory:write"], ["payments"])  # the role
    reader = mint(server.url, server.admin_key, "reader", ["memory:read"])["secret"]
    secret = "Payments-only: the Stripe webhook retry window is 72 hours."
    remember(server, body=secret, audiences=["payments"])
    env = {"RELAY_URL": server.url, "RELAY_API_KEY": server.admin_key}
    backup = tmp_path / "memories-backup.jsonl"
    assert relay(tmp_path, "export", "-o", str(backup), **env).returncode == 0
    assert secret in backup.read_text(encoding="utf-8")
    before = every_memory(server)
    agents = write(git_repo(tmp_path / "qa-export") / "AGENTS.md", "# Build\nRun make.\n")

    for args in (["memories-backup.jsonl"], [str(agents), "memories-backup.jsonl"]):
        done = relay_import(server, tmp_path, *args)
        assert done.returncode == 2, done.stdout
        assert done.stderr == (
            "relay: error: memories-backup.jsonl is a relay export file: restore it with"
            " `relay restore memories-backup.jsonl`; relay import reads Markdown (.md,"
            " .markdown: CLAUDE.md, AGENTS.md), .cursorrules, .mdc and plain-text rule files"
            " (.txt, .windsurfrules) and would mangle it; nothing was imported\n"
        )
    assert every_memory(server) == before
    found = httpx.post(
        f"{server.url}/v1/search",
        json={"query": "Stripe webhook retry window refunds", "deadline_ms": 2000},
        headers={"Authorization": f"Bearer {reader}"},
        timeout=30,
    ).json()["results"]
    assert all("Stripe" not in r["text"] for r in found)


def test_long_sections_travel_in_requests_the_server_accepts(tmp_path, server):
    """One batch of long sections was refused whole: 'request body too large'."""
    accented = "Déjà vérifié à l'étape précédente: côté serveur, réécrire l'entrée. " * 60
    repo = git_repo(tmp_path / "qa-long")
    write(repo / "GUIDE.md", "".join(f"# Étape {i}\n{accented}\n\n" for i in range(40)))
    done = relay_import(server, repo, "GUIDE.md")
    assert summary(done) == "imported 40 memories: 40 new or changed, 0 unchanged, 0 retired"
    assert len(live_memories(server, "qa-long/GUIDE.md")) == 40


def test_an_empty_folder_has_nothing_to_import_and_that_is_no_error(tmp_path, server):
    """QA: `relay import docs` of a folder with no importable file yet (a new repository's
    docs/, a CI job run before its first runbook) failed as a usage error, exit 2, which
    failed the job. It says there is nothing to import, and exits 0; a path that is not
    there is still an error."""
    home = tmp_path / "home"
    (tmp_path / "docs" / "img").mkdir(parents=True)
    write(tmp_path / "docs" / "img" / "diagram.svg", "<svg/>\n")
    (tmp_path / "empty").mkdir()
    done = relay_import(server, tmp_path, "docs", "empty", home=home)
    assert (summary(done), done.stderr) == (
        "nothing to import in docs and 1 more: no file relay import reads there, nor memories"
        " of files gone from there to retire",
        "",
    )
    kept = relay_import(server, tmp_path, "--keep-removed", "empty", home=home)
    assert summary(kept) == "nothing to import in empty: no file relay import reads there"
    typo = relay_import(server, tmp_path, "emtpy", home=home)
    assert (typo.returncode, typo.stdout) == (2, "")
    assert typo.stderr.startswith("relay: error: no such file or folder: emtpy")


def test_a_file_with_nothing_to_import_says_so(tmp_path, server):
    """QA (session 7): an empty file, or one with only front matter, printed 'imported 0
    memories' and nothing else."""
    write(tmp_path / "empty.md", "")
    write(tmp_path / "meta.mdc", "---\ndescription: nothing yet\n---\n")
    done = relay_import(server, tmp_path, "empty.md", "meta.mdc")
    assert done.returncode == 0, done.stderr
    assert "empty.md holds no section with text: nothing to import" in done.stderr
    assert "meta.mdc holds no section with text: nothing to import" in done.stderr


def test_a_control_character_in_one_file_is_replaced_and_named_not_a_refused_import(
    tmp_path, server
):
    """QA: one NUL, or the ESC of a terminal colour pasted into a runbook, refused the whole
    import ('body contains control characters'), every other file with it. Such a character
    is replaced by U+FFFD where it stood, a warning names the file, the section and the
    characters, and everything is imported; a file of NULs (UTF-16) is skipped as not text."""
    repo = git_repo(tmp_path / "qa-controls")
    write(repo / "AGENTS.md", "# Build\nRun make.\n")
    write(repo / "docs" / "runbook.md", "# Errors\nThey show \x1b[31mred\x1b[0m.\n# Ok\nFine.\n")
    write(repo / "docs" / "notes.md", "# Dump\nA NUL\x00 here.\n")
    args = ("--source-prefix", "qa-controls", "AGENTS.md", "docs")
    done = relay_import(server, repo, *args)
    assert summary(done) == "imported 4 memories: 4 new or changed, 0 unchanged, 0 retired"
    said = (
        " replaced with U+FFFD (\ufffd): a memory holds none (terminal escape codes, binary"
        " data); edit the file to drop or replace them"
    )
    warnings = [
        f"relay: warning: qa-controls/docs/notes.md › Dump: 1 control character (\\x00){said}",
        f"relay: warning: qa-controls/docs/runbook.md › Errors: 2 control characters (\\x1b){said}",
    ]
    assert done.stderr.splitlines() == warnings, done.stderr
    runbook = ["Fine.", "They show \ufffd[31mred\ufffd[0m."]
    assert bodies(server, "qa-controls/docs/runbook.md") == runbook
    assert bodies(server, "qa-controls/docs/notes.md") == ["A NUL\ufffd here."]
    assert bodies(server, "qa-controls/AGENTS.md") == ["Run make."]
    again = relay_import(server, repo, *args)  # the same memories, said again till fixed
    assert summary(again) == "imported 4 memories: 0 new or changed, 4 unchanged, 0 retired"
    assert again.stderr.splitlines() == warnings

    (repo / "docs" / "wide.md").write_bytes("# Wide\nUTF-16 text.\n".encode("utf-16-le"))
    wide = relay_import(server, repo, *args)
    assert wide.returncode == 2
    assert wide.stdout.startswith("imported 4 memories: 0 new or changed, 4 unchanged")
    assert wide.stderr.splitlines()[-2:] == [
        "relay: skipped docs/wide.md: docs/wide.md is not UTF-8 text (one character in 2 is a"
        " NUL: binary data, or UTF-16 text)",
        "relay: error: 1 file(s) could not be imported (see above)",
    ]


# --- what the command says -------------------------------------------------------------------


def test_broken_symlinks_in_a_folder_are_named_and_the_rest_imported(tmp_path, server):
    """QA: a folder whose CLAUDE.md was a symlink to a file since moved imported the other
    files and said nothing of it: its memories were simply missing. Each broken symlink
    with an importable name is named (the first few; the others counted), the import
    still succeeds, and one git ignores stays unsaid, as git ignores it."""
    repo = git_repo(tmp_path / "qa-broken-links")
    write(repo / ".gitignore", "*.local.md\n")
    write(repo / "docs" / "build.md", "# Build\nRun make.\n")
    (repo / "CLAUDE.md").symlink_to("docs/moved-away.md")
    (repo / "docs" / "loop.mdc").symlink_to("loop.mdc")
    for i in range(6):
        (repo / "docs" / f"old-{i}.md").symlink_to(f"../archive/old-{i}.md")
    (repo / "mine.local.md").symlink_to("nowhere.md")  # git ignores it: not said
    (repo / "diagram.svg").symlink_to("nowhere.svg")  # not an importable name: not said
    done = relay_import(server, repo, "--source-prefix", "qa-broken-links", ".")
    assert summary(done) == (
        "imported 1 memory: 1 new or changed, 0 unchanged, 0 retired; skipped 1 file git ignores"
    )
    assert done.stderr.splitlines() == [
        "relay: warning: skipped CLAUDE.md: a symlink to docs/moved-away.md, which is not there",
        "relay: warning: skipped docs/loop.mdc: a symlink to loop.mdc, which is not there",
        *(
            f"relay: warning: skipped docs/old-{i}.md: a symlink to ../archive/old-{i}.md,"
            " which is not there"
            for i in range(3)
        ),
        "relay: warning: skipped 3 more that are not files to read",
    ], done.stderr
    assert bodies(server, "qa-broken-links/docs/build.md") == ["Run make."]

    named = relay_import(server, repo, "CLAUDE.md")
    assert (named.returncode, named.stdout, named.stderr) == (
        2,
        "",
        "relay: error: CLAUDE.md is a symlink to docs/moved-away.md, which is not there"
        " (see 'relay import --help')\n",
    )


def test_a_fifo_or_a_symlinked_folder_with_a_files_name_is_named_not_skipped_unsaid(
    tmp_path, server
):
    """QA: `mkfifo docs/notes.md` and `ln -s /tmp docs/dir.md` were left out of a folder's
    import without a word, unlike a symlink that leads nowhere: each is named with what it
    is, and the rest imported. A symlinked folder is still not followed, nor a FIFO read
    (it would wait for ever); one git ignores stays unsaid, as git ignores it."""
    repo = git_repo(tmp_path / "qa-not-files")
    write(repo / ".gitignore", "*.local.md\n")
    write(repo / "docs" / "build.md", "# Build\nRun make.\n")
    write(repo / "elsewhere" / "ops.md", "# Paging\nPage the on-call.\n")
    os.mkfifo(repo / "docs" / "notes.md")
    (repo / "docs" / "dir.md").symlink_to("../elsewhere")
    (repo / "docs" / "pipe.mdc").symlink_to("notes.md")
    (repo / "docs" / "mine.local.md").symlink_to("../elsewhere")  # git ignores it: counted
    os.mkfifo(repo / "docs" / "feed")  # not an importable name: not said
    done = relay_import(server, repo, "--source-prefix", "qa-not-files", "docs")
    assert summary(done) == (
        "imported 1 memory: 1 new or changed, 0 unchanged, 0 retired; skipped 1 folder git ignores"
    )
    assert done.stderr.splitlines() == [
        "relay: warning: skipped docs/dir.md: a symlink to ../elsewhere, a folder: symlinked"
        " folders are not followed (name it to import it)",
        "relay: warning: skipped docs/notes.md: a FIFO (named pipe), not a file: reading it"
        " would wait for a writer",
        "relay: warning: skipped docs/pipe.mdc: a symlink to notes.md, a FIFO (named pipe), not"
        " a file: reading it would wait for a writer",
    ], done.stderr
    assert bodies(server, "qa-not-files/docs/build.md") == ["Run make."]


def test_a_control_character_python_reads_as_space_is_replaced_and_named_too(tmp_path, server):
    """QA: 0x1C-0x1F at a line's end were dropped, and in a heading turned into spaces,
    without a word (Python reads them as whitespace), where a NUL or an ESC becomes U+FFFD
    with a warning. They are replaced and named the same way."""
    repo = git_repo(tmp_path / "qa-space-controls")
    write(repo / "notes.md", "# Ro\x1fll\x1cback\nRevert the tag.\x1e\n# Build\nRun make.\x1f\n")
    done = relay_import(server, repo, "--source-prefix", "qa-space-controls", "notes.md")
    assert summary(done) == "imported 2 memories: 2 new or changed, 0 unchanged, 0 retired"
    said = (
        " replaced with U+FFFD (\ufffd): a memory holds none (terminal escape codes, binary"
        " data); edit the file to drop or replace them"
    )
    assert done.stderr.splitlines() == [
        "relay: warning: qa-space-controls/notes.md › Ro\ufffdll\ufffdback: 3 control"
        f" characters (\\x1c, \\x1e, \\x1f){said}",
        f"relay: warning: qa-space-controls/notes.md › Build: 1 control character (\\x1f){said}",
    ], done.stderr
    memories = {m["title"]: m["body"] for m in live_memories(server, "qa-space-controls/notes.md")}
    assert memories == {
        "Ro\ufffdll\ufffdback": "Revert the tag.\ufffd",
        "Build": "Run make.\ufffd",
    }


def test_what_is_not_a_file_and_a_missing_root_are_refused_up_front(tmp_path, server):
    """QA: `relay import /dev/null` said 'no such file or directory: /dev/null', and
    `--root /nonexist` was accepted, each file then failing on its own."""
    notes = write(tmp_path / "notes.md", "# A\nFact.\n")
    done = relay_import(server, tmp_path, str(notes), "/dev/null")
    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith("relay: error: /dev/null is not a file or a folder: relay")
    assert done.stderr.endswith("; nothing was imported\n")
    done = relay_import(server, tmp_path, "--root", str(tmp_path / "nonexist"), "notes.md")
    assert done.returncode == 2, done.stdout
    assert "'--root'" in done.stderr and "does not exist" in done.stderr
    assert "skipped" not in done.stderr
    assert live_memories(server, placed(notes)) == []


def test_without_a_terminal_there_is_no_progress_line(tmp_path, server):
    """QA: piped, the progress bar was one lone 'importing' line, even before an error."""
    repo = git_repo(tmp_path / "qa-quiet")
    write(repo / "AGENTS.md", "# Build\nRun make.\n")
    done = relay_import(server, repo, "--source-prefix", "qa-quiet", "AGENTS.md")
    assert summary(done) == "imported 1 memory: 1 new or changed, 0 unchanged, 0 retired"
    assert done.stderr == ""
    done = relay_import(server, repo, "--source-prefix", "qa-quiet", "AGENTS.md", key="nope")
    assert done.returncode == 3 and done.stderr.startswith("relay: error: ")
    assert "importing" not in done.stderr


@pytest.mark.parametrize("stop", ["interrupt", "terminate"])
def test_ctrl_c_says_what_was_written_and_that_running_again_finishes(tmp_path, server, stop):
    """QA: Ctrl-C during an import exited with just 'aborted', saying nothing of what it
    had written; then it said '128 of 3000 imported' and 'aborted' on a second line, while
    256 were stored: the batch on its way when Ctrl-C came was written too. QA (ops):
    SIGTERM (a cancelled CI job) ended it without a word, exit -15."""
    repo = git_repo(tmp_path / f"qa-ctrl-c-{stop}")
    write(repo / "AGENTS.md", "".join(f"# Rule {i}\nKeep rule {i}.\n\n" for i in range(300)))
    with BatchProxy(server.url, nth=2, act=stop) as proxy:
        env = clean_env(repo, RELAY_URL=proxy.url, RELAY_API_KEY=server.admin_key)
        code, out, err = proxy.run(["import", "AGENTS.md"], env, repo)
    assert code == 1, err
    assert out == ""
    assert err.splitlines()[-1] == (
        "relay: interrupted with 128 of 300 memories imported (128 new or changed, 0 unchanged)"
        " and 0 retired, and 128 more sent that the server may still write; running the same"
        " import again finishes it"
    ), err
    assert "aborted" not in err
    assert len(live_memories(server, f"qa-ctrl-c-{stop}/AGENTS.md")) == 128
    again = relay_import(server, repo, "AGENTS.md")
    assert summary(again) == "imported 300 memories: 172 new or changed, 128 unchanged, 0 retired"


def test_a_batch_failing_midway_says_how_many_were_written_before_it(tmp_path, server):
    """QA: an import that failed on its second batch said only why, not that the first
    batch's memories were written."""
    repo = git_repo(tmp_path / "qa-midway")
    write(repo / "AGENTS.md", "".join(f"# Rule {i}\nKeep rule {i}.\n\n" for i in range(300)))
    with BatchProxy(server.url, nth=2, act="overloaded") as proxy:
        env = clean_env(repo, RELAY_URL=proxy.url, RELAY_API_KEY=server.admin_key)
        code, out, err = proxy.run(["import", "AGENTS.md"], env, repo)
    assert code == 6, err
    assert err.splitlines()[-1] == (
        "relay: error: server busy; the import stopped there, with 128 of 300 memories"
        " imported (128 new or changed, 0 unchanged) and 0 retired; once that is dealt with,"
        " running the same import again finishes it"
    ), err
    assert len(live_memories(server, "qa-midway/AGENTS.md")) == 128


def test_a_timeout_is_said_as_one_not_as_an_unreachable_server():
    """QA: an import whose batch took longer than the client's 30 s said "cannot reach the
    Relay server at ...: timed out" while the server was up, and had written 55 memories."""
    import time

    from conftest import free_port
    from hook_support import FakeRelay

    from relay.client import ConnectionFailedError, RelayClient, TimedOutError

    with FakeRelay(lambda conn, request: time.sleep(3)) as slow:
        client = RelayClient(slow.url, "relay_k_s", timeout=0.5)
        with pytest.raises(TimedOutError) as wrote:
            client.post("/v1/memories/batch", {"items": []})
        with pytest.raises(TimedOutError) as read:
            client.get("/v1/memories")
        with pytest.raises(TimedOutError) as searched:  # a POST that writes nothing
            client.post("/v1/search", {"query": "deploy"})
    assert searched.value.message == read.value.message
    assert wrote.value.message == (
        f"the Relay server at {slow.url} did not answer within 0.5 s; it may still have"
        " written this request"
    )
    assert read.value.message == f"the Relay server at {slow.url} did not answer within 0.5 s"
    assert wrote.value.exit_code == 8
    nobody = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ConnectionFailedError) as down:
        RelayClient(nobody, "relay_k_s", timeout=0.5).get("/v1/memories")
    assert down.value.message.startswith(f"cannot reach the Relay server at {nobody}: ")


def test_a_batch_of_long_sections_is_bounded_by_its_text():
    """QA: 200 sections of ~500 words went in batches of ~60 (all the byte bound let
    through): the server embeds every passage before answering, and one batch outlasted
    the client's 30 s timeout."""
    from relay.client import BATCH_TEXT_CHARS, batches

    section = ("Deploys go through the staging cluster first. " * 70).strip()  # ~500 words
    items = [{"title": f"Step {i}", "body": section} for i in range(128)]
    runs = list(batches(items, lambda item: item))
    assert sum(len(run) for run in runs) == 128
    for run in runs:
        assert sum(len(i["title"]) + len(i["body"]) for i in run) <= BATCH_TEXT_CHARS
    huge = [{"title": "Big", "body": "x" * (BATCH_TEXT_CHARS + 1)}, *items[:2]]
    assert [len(run) for run in batches(huge, lambda item: item)][0] == 1  # alone, still sent


def test_an_unreadable_file_among_others_ends_in_a_relay_error(tmp_path, server):
    """QA: the others were imported, then the last line was 'Error: 1 file(s) could not be
    imported (see above)', in click's format, unlike every other 'relay: error:'."""
    repo = git_repo(tmp_path / "qa-latin1")
    write(repo / "good.md", "# Build\nRun make.\n")
    (repo / "bad.md").write_bytes("# Caf\xe9\nTh\xe9.\n".encode("latin-1"))
    done = relay_import(server, repo, "--source-prefix", "qa-latin1", "good.md", "bad.md")
    assert done.returncode == 2, done.stderr
    assert done.stdout.startswith("imported 1 memory:")
    assert done.stderr.splitlines() == [
        "relay: skipped bad.md: bad.md is not UTF-8 text",
        "relay: error: 1 file(s) could not be imported (see above)",
    ], done.stderr
    assert len(live_memories(server, "qa-latin1/good.md")) == 1


def test_a_line_break_in_a_source_is_quoted_and_the_error_stays_one_line(tmp_path, server):
    """QA: `--source-prefix "$(printf 'bad\nprefix')"` was echoed raw: 'relay: error: bad'
    then 'prefix/tmp/...' on a second line."""
    repo = git_repo(tmp_path / "qa-newline")
    write(repo / "AGENTS.md", "# Build\nRun make.\n")
    done = relay_import(server, repo, "--source-prefix", "bad\nprefix", "AGENTS.md")
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "relay: error: --source-prefix 'bad\\nprefix' holds a line break or another control"
        " character: a source is one line, like docs/deploy.md\n"
    )
    write(repo / "odd\nname.md", "# Build\nRun make.\n")
    done = relay_import(server, repo, "odd\nname.md")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("relay: error: 'qa-newline/odd\\nname.md' › Build: source")
