"""Helpers for the browser tests of the console: a real `relay serve`, Debian's headless
Chromium driven through Selenium, and `Console`, the page as a user drives it.

Chromium and its driver are Debian's (`scripts/setup.sh --dev` installs them). Every page
a test saves with `Console.shot` lands under a pytest temporary directory whose path is
printed at the end of the module.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from relay.auth import mint_key
from relay.store.sqlite import SQLiteStore

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 15

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    pytest.fail(
        "Debian's chromium and chromium-driver are missing: run ./scripts/setup.sh --dev",
        pytrace=False,
    )

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@contextmanager
def console_server(folder: Path) -> Iterator[dict]:
    """`relay serve` on its own database in `folder`, with keys of narrower reach beside the
    admin's and a second org: {"url": ..., "keys": {"admin", "reader", "sre", "writer",
    "globex"}}."""
    from conftest import start_server

    db = folder / "relay.db"
    server = start_server(db)
    store = SQLiteStore(db)
    try:
        acme = store.find_org("acme")
        globex = store.create_org("globex")
        assert acme is not None
        read, write = frozenset({"memory:read"}), frozenset({"memory:read", "memory:write"})
        keys = {
            "admin": server.admin_key,
            "reader": mint_key(store, acme.id, "reader", read, frozenset({"dev"})).secret,
            "sre": mint_key(store, acme.id, "sre-bot", read, frozenset({"sre"})).secret,
            "writer": mint_key(store, acme.id, "dev-writer", write, frozenset({"dev"})).secret,
            "globex": mint_key(
                store, globex.id, "globex-admin", frozenset({"admin"}), frozenset()
            ).secret,
        }
    finally:
        store.close()
    try:
        yield {"url": server.url, "keys": keys}
    finally:
        server.stop()


@contextmanager
def chromium() -> Iterator[webdriver.Chrome]:
    """Headless Chromium on a throwaway profile, never fetching anything of its own."""
    profile = tempfile.mkdtemp(prefix="relay-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--window-size=1280,1400",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(arg)
    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager fetch anything
    browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield browser
    finally:
        browser.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot_folder(tmp_path_factory, request) -> Iterator[Path]:  # noqa: ANN001
    """A module's screenshot folder; its path is printed once the module is done."""
    folder = tmp_path_factory.mktemp("console-screenshots")
    yield folder
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        count = len(list(folder.glob("*.png")))
        with capture.global_and_fixture_disabled():  # past pytest's capture, even with -q
            reporter.write_line(f"\nconsole screenshots ({count}): {folder}")


# -- the fixtures both console modules use: imported there under these names, pytest
# knows them by the `name` given (so a test's `live` argument shadows no import)
@pytest.fixture(scope="module", name="live")
def live_fixture(tmp_path_factory, request) -> Iterator[dict]:  # noqa: ANN001
    """`relay serve` on the module's own database, plus a second org and keys with narrower
    access (`console_server`)."""
    with console_server(tmp_path_factory.mktemp(request.module.__name__)) as server:
        yield server


@pytest.fixture(scope="module", name="api")
def api_fixture(live) -> Iterator[httpx.Client]:  # noqa: ANN001
    """The HTTP API with the acme admin key, for arranging data and checking effects."""
    headers = {"Authorization": f"Bearer {live['keys']['admin']}"}
    with httpx.Client(base_url=live["url"], headers=headers, timeout=60) as client:
        yield client


@pytest.fixture(scope="module", name="shots")
def shots_fixture(tmp_path_factory, request) -> Iterator[Path]:  # noqa: ANN001
    yield from screenshot_folder(tmp_path_factory, request)


@pytest.fixture(scope="module", name="driver")
def driver_fixture() -> Iterator[webdriver.Chrome]:
    with chromium() as browser:
        yield browser


@pytest.fixture(name="console")
def console_fixture(driver, live, shots) -> Console:  # noqa: ANN001
    return Console(driver, live["url"], shots)


class Console:
    """The page as a user drives it: sign in, go places, fill forms, wait for answers."""

    def __init__(self, driver: webdriver.Chrome, url: str, shots: Path) -> None:
        self.d = driver
        self.url = url
        self.shots = shots

    def wait(self, condition, timeout: float = WAIT_S):  # noqa: ANN001, ANN201
        return WebDriverWait(self.d, timeout).until(condition)

    def fresh_page(self) -> None:
        """The console loaded anew, signed out."""
        self.d.get(f"{self.url}/console")
        self.d.delete_all_cookies()
        self.d.get(f"{self.url}/console?load={time.monotonic()}")

    def sign_in(self, key: str) -> None:
        self.fresh_page()
        box = self.wait(ec.visibility_of_element_located((By.NAME, "key")))
        box.send_keys(key, Keys.ENTER)
        self.wait(ec.visibility_of_element_located((By.ID, "nav")))
        self.heading("Memories")

    def go(self, route: str) -> None:
        """Follow a console route and wait until the page it leaves is gone."""
        if self.d.execute_script("return location.hash") == route:
            return
        old = self.d.find_elements(By.ID, "page-title")
        self.d.execute_script("location.hash = arguments[0]", route)
        if old:
            self.wait(ec.staleness_of(old[0]))

    def heading(self, text: str | None = None) -> str:
        if text is not None:
            self.wait(ec.text_to_be_present_in_element((By.ID, "page-title"), text))
        return self.d.find_element(By.ID, "page-title").text

    def fill(self, name: str, value: str, scope: WebElement | None = None) -> None:
        el = (scope or self.d).find_element(By.NAME, name)
        el.clear()
        el.send_keys(value)

    def click(self, text: str, scope: WebElement | None = None) -> None:
        root = scope or self.d
        root.find_element(By.XPATH, f".//button[normalize-space()='{text}']").click()

    def text_of(self, element_id: str) -> str:
        """An element's textContent (exact, unlike WebElement.text)."""
        el = self.wait(ec.presence_of_element_located((By.ID, element_id)))
        return self.d.execute_script("return arguments[0].textContent", el)

    def alert(self, containing: str = "") -> str:
        """The error the page shows, once it contains `containing`."""
        self.wait(ec.text_to_be_present_in_element((By.ID, "alert"), containing))
        return self.wait(ec.visibility_of_element_located((By.ID, "alert"))).text

    def fetch_status(self, path: str) -> int:
        """The HTTP status the page's own script gets for `path` (with the session cookie)."""
        return self.d.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(arguments[0]).then(r => done(r.status), () => done(-1));",
            path,
        )

    def shot(self, name: str) -> None:
        time.sleep(0.15)  # let focus rings and layout settle
        number = len(list(self.shots.glob("*.png"))) + 1
        height = self.d.execute_script("return document.documentElement.scrollHeight")
        self.d.set_window_size(1280, max(900, min(int(height) + 200, 6000)))
        self.d.save_screenshot(str(self.shots / f"{number:02d}-{name}.png"))
        self.d.set_window_size(1280, 1400)

    def create_memory(self, **fields: str) -> str:
        """Fill the New memory form; returns the new memory's id, read from its page."""
        self.go("#/new")
        self.heading("New memory")
        for name, value in fields.items():
            self.fill(name, value)
        self.click("Create memory")
        self.wait(lambda d: "#/memory/" in d.current_url)
        self.wait(ec.presence_of_element_located((By.ID, "memory-body")))
        return self.d.find_element(By.CSS_SELECTOR, "dl.meta dd code").text

    def memory_ids_listed(self, query: str = "") -> list[str]:
        self.go(f"#/memories?{query}&_={time.monotonic()}")
        self.heading("Memories")
        self.wait(lambda d: "shown" in d.find_element(By.CSS_SELECTOR, "main p.hint").text)
        rows = self.d.find_elements(By.CSS_SELECTOR, "table.memories tbody a")
        return [r.get_attribute("href").rsplit("/", 1)[-1] for r in rows]
