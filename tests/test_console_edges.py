"""The console at its edges, in headless Chromium against a real `relay serve`: many
memories, a phone's width, right-to-left text, writes that leave the key's sight, deleted
memories, a memory edited under an open page, and errors placed by their field.

Each test here is a defect a QA pass found in the browser; test_console.py has the
console's main paths.
"""

from __future__ import annotations

import time

import httpx
from console_support import (  # noqa: F401 (the *_fixture: pytest finds them by name)
    By,
    Console,
    api_fixture,
    console_fixture,
    driver_fixture,
    ec,
    live_fixture,
    shots_fixture,
)

PHONE_WIDTH = 390


def remember(api: httpx.Client, **fields: object) -> str:
    answer = api.post("/v1/memories", json=fields)
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def test_load_more_clicked_twice_lists_each_memory_once(console: Console, live, api) -> None:
    """QA: a second click while a page loaded asked for the same cursor again, and 50
    memories were listed twice (150 rows for 100 memories). Then: the list ran in id order,
    had no text filter, matched a source exactly, and Apply with the filters unchanged did
    nothing (the same route fires no hashchange), so it never listed from the top again."""
    items = [
        {
            "id": f"paging-{n:02d}",
            "body": f"Paging probe {n}: the queue worker {n} drains the outbox.",
            "source": f"docs/queue/{n:02d}.md#Drain",
            "tags": ["paging"],
        }
        for n in range(60)
    ]
    api.post("/v1/memories/batch", json={"items": items}).raise_for_status()
    console.sign_in(live["keys"]["admin"])
    console.go("#/memories?tag=paging&status=any&expiring_days=7")  # as Apply spells it
    more = console.wait(
        ec.visibility_of_element_located((By.XPATH, "//button[normalize-space()='Load more']"))
    )
    console.d.execute_script("arguments[0].click(); arguments[0].click();", more)
    console.wait(ec.text_to_be_present_in_element((By.CSS_SELECTOR, "main p.hint"), "shown."))
    time.sleep(1)  # what a second request would have added lands by now
    rows = console.d.find_elements(By.CSS_SELECTOR, "table.memories tbody tr")
    assert len(rows) == 60
    assert console.d.find_element(By.CSS_SELECTOR, "main p.hint").text == "60 memories shown."

    def shown(count: str) -> list[str]:
        hint = (By.CSS_SELECTOR, "main p.hint")
        console.wait(ec.text_to_be_present_in_element(hint, f"{count} shown"))
        links = console.d.find_elements(By.CSS_SELECTOR, "table.memories tbody a")
        return [a.get_attribute("href").rsplit("/", 1)[-1] for a in links]

    console.click("Apply filters")  # the same route: no hashchange, and the list stayed
    assert shown("50 memories")[:2] == ["paging-59", "paging-58"]  # the batch wrote 59 last
    console.fill("q", "WORKER 42 drains")
    console.click("Apply filters")
    assert shown("1 memory") == ["paging-42"]
    assert "q=WORKER+42+drains" in console.d.current_url
    console.d.refresh()  # the filter is in the route: a reload or a shared link keeps it
    assert shown("1 memory") == ["paging-42"]
    assert console.d.find_element(By.NAME, "q").get_attribute("value") == "WORKER 42 drains"
    console.fill("q", "")
    console.fill("source_prefix", "docs/queue/4")
    console.click("Apply filters")
    assert shown("10 memories") == [f"paging-{n}" for n in range(49, 39, -1)]
    console.shot("memories-filtered-by-source-prefix")


def test_a_write_out_of_the_keys_sight_says_it_was_saved(console: Console, live, api) -> None:
    """QA: a dev key that wrote a memory for sre was shown "Memory not found" and a red
    not_found error, as if the write had failed; the server's warning went only to screen
    readers."""
    console.sign_in(live["keys"]["writer"])
    console.go("#/new")
    console.fill("body", "The SRE pager rota lives in the ops calendar.")
    console.fill("audiences", "sre")
    console.click("Create memory")
    console.heading("saved")
    warning = console.text_of("write-warning")
    assert warning.startswith("Saved as revision 1, but this key cannot read memory")
    assert not console.d.find_element(By.ID, "alert").is_displayed()
    console.shot("write-out-of-sight")

    own = remember(api, body="Dev laptops use the dev VPN profile.", audiences=["dev"])
    console.go(f"#/memory/{own}")
    console.wait(ec.element_to_be_clickable((By.ID, "edit-button"))).click()
    console.fill("audiences", "sre")
    console.click("Save new revision")
    console.heading(f"Memory {own} saved")
    assert console.text_of("write-warning").startswith("Saved as revision 2, but")
    assert api.get(f"/v1/memories/{own}").json()["audiences"] == ["sre"]


def test_delete_keeps_a_memory_edited_since_the_page_showed_it(console: Console, live, api) -> None:
    """QA: the console deleted whatever revision the memory had reached, so an edit made
    while the page was open was thrown away unseen; its edit form already refused that."""
    memory_id = remember(api, body="The on-call handbook is in the wiki.")
    console.sign_in(live["keys"]["admin"])
    console.go(f"#/memory/{memory_id}")
    delete = console.wait(ec.element_to_be_clickable((By.ID, "delete-button")))
    edit = {"body": "The on-call handbook moved to docs/oncall.md."}
    api.patch(f"/v1/memories/{memory_id}", json=edit).raise_for_status()
    delete.click()
    console.click(
        "Delete memory", console.wait(ec.visibility_of_element_located((By.ID, "confirm")))
    )
    assert f"memory {memory_id!r} is at revision 2, not 1" in console.alert("conflict")
    assert api.get(f"/v1/memories/{memory_id}").json()["body"] == edit["body"]


def test_a_deleted_memory_shows_its_history(console: Console, live, api) -> None:
    """QA: a deleted memory's page said "not found", though its history (who deleted it,
    when) is kept and `relay history` shows it."""
    memory_id = remember(api, body="Builds are cached in the blue bucket.")
    api.patch(f"/v1/memories/{memory_id}", json={"title": "Build cache"}).raise_for_status()
    api.delete(f"/v1/memories/{memory_id}").raise_for_status()
    console.sign_in(live["keys"]["admin"])
    console.go(f"#/memory/{memory_id}")
    console.heading(f"Memory {memory_id} deleted")
    assert console.text_of("deleted").startswith("Deleted at ")
    actions = console.d.find_elements(By.CSS_SELECTOR, "table.history tbody td:nth-child(4)")
    assert [a.text for a in actions] == ["create", "edit", "delete"]
    assert "Builds are cached" not in console.d.find_element(By.ID, "main").text
    console.shot("deleted-memory-history")


def test_an_error_stands_under_its_field_until_the_next_answer(console: Console, live) -> None:
    """QA: the error was printed above the submit button, far from the field it named; a
    refused `supersedes` or past `expires_at` marked no field (no `details.field`); and a
    field marked by a refusal stayed marked after the next submit succeeded."""
    console.sign_in(live["keys"]["admin"])
    console.go("#/new")
    console.fill("body", "The release train leaves on Tuesdays.")
    console.fill("supersedes", "mem_nothing_here")
    console.click("Create memory")
    console.alert("not a memory of this organisation")
    under = console.d.execute_script(
        "const f = document.querySelector('[name=supersedes]');"
        "const note = f.closest('.field').nextElementSibling;"
        "return [f.getAttribute('aria-invalid'), note.className, note.textContent,"
        " f.getAttribute('aria-describedby').split(' ').includes(note.id)];"
    )
    assert under[:2] == ["true", "form-error"] and "mem_nothing_here" in under[2] and under[3]
    console.shot("error-under-its-field")

    console.go("#/keys")
    console.heading("API keys")
    console.fill("name", "ci")
    console.fill("expires_at", "2001-01-01")
    console.click("Create key")
    console.alert("expires_at is in the past")
    assert console.d.find_element(By.NAME, "expires_at").get_attribute("aria-invalid") == "true"
    console.fill("expires_at", "")
    console.click("Create key")
    console.wait(ec.presence_of_element_located((By.ID, "secret-value")))
    assert console.d.find_elements(By.CSS_SELECTOR, "main [aria-invalid], main .form-error") == []


def test_a_phone_width_page_never_scrolls_sideways(console: Console, live, api) -> None:
    """QA: at 390 px the memories, keys and history tables and the author select made every
    such page wider than the screen (596 px for the memories)."""
    memory_id = remember(api, body="Deploys need a green build.", source="team/infra/deploys")
    api.patch(f"/v1/memories/{memory_id}", json={"tags": ["deploy"]}).raise_for_status()
    console.sign_in(live["keys"]["admin"])
    console.d.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": PHONE_WIDTH, "height": 844, "deviceScaleFactor": 1, "mobile": True},
    )
    try:
        widths = {}
        for route, ready in (
            ("#/memories", "table.memories tbody tr"),
            ("#/keys", "table.keys tbody tr"),
            (f"#/memory/{memory_id}", "table.history tbody tr"),
        ):
            console.go(route)
            console.wait(ec.presence_of_element_located((By.CSS_SELECTOR, ready)))
            widths[route] = console.d.execute_script("return document.documentElement.scrollWidth")
        assert widths == dict.fromkeys(widths, PHONE_WIDTH)
    finally:
        console.d.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_a_persian_line_reads_right_to_left(console: Console, live, api) -> None:
    """QA: in a memory's body, a Persian sentence was laid out as left-to-right text, its
    full stop drawn at its start (the right) instead of its end (the left)."""
    persian = "سرور استیجینگ روی خوشه آبی اجرا می‌شود."
    memory_id = remember(api, body=f"{persian}\nThe staging server runs on the blue cluster.")
    console.sign_in(live["keys"]["admin"])
    console.go(f"#/memory/{memory_id}")
    body = console.wait(ec.presence_of_element_located((By.ID, "memory-body")))
    first, stop = console.d.execute_script(
        "const text = arguments[0].firstChild, r = document.createRange();"
        "const x = (i) => { r.setStart(text, i); r.setEnd(text, i + 1);"
        " return r.getBoundingClientRect().left; };"
        "return [x(0), x(arguments[1] - 1)];",
        body,
        len(persian),
    )
    assert stop < first  # the sentence ends on the left


def test_health_tells_a_developer_to_opt_in_with_relay_stats_send(console: Console, live) -> None:
    """QA: with no reports yet, Health showed a hand-made curl pipeline where docs/console.md
    (and `relay stats --help`) give `relay stats --send`."""
    console.sign_in(live["keys"]["admin"])
    console.go("#/health")
    console.heading("Health")
    text = console.d.find_element(By.ID, "main").text
    assert "No developer has sent hook outcomes yet" in text
    assert "relay stats --send" in text and "curl" not in text
