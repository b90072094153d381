"""Browser tests of the dashboard: headless Chromium (Debian's ``chromium``) driven by Playwright for Python, against
a real ``scrapy dashboard`` process on a seeded Redis and MongoDB. One page load per view.

Chromium is the system's (``/usr/bin/chromium``, or ``PC_CHROMIUM``): never ``playwright install``. Where it is
missing these tests are skipped with a message saying how to install it, except under ``CI=true``, where they fail.
On failure, a screenshot of every view is written to the test's temporary folder (the path is printed).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pymongo
import pytest
import redis as redis_lib
from dashboard_seed import EXPECTED, PRODUCT, TOKEN, run, seed, start_dashboard

from scheduler_ext.keys import Keys
from scheduler_ext.store import Store

VIEWS = ("cluster", "matrix", "products", "deadletters", "items")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update"]
INSTALL_HINT = ("as root: apt-get install -y chromium (Debian's package; `make test` does this where it can), or set "
                "PC_CHROMIUM to a Chromium binary; never `playwright install`")


def chromium_path() -> str | None:
    """``PC_CHROMIUM`` if set (only it), else Debian's /usr/bin/chromium or a ``chromium`` on PATH."""
    candidates = [os.environ["PC_CHROMIUM"]] if os.environ.get("PC_CHROMIUM") else ["/usr/bin/chromium",
                                                                                   shutil.which("chromium")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


class Browser:
    """One headless Chromium for the module, driven from one worker thread of its own: Playwright's sync API refuses
    a thread whose asyncio loop runs, and pytest-twisted runs the asyncio reactor's loop in the main thread."""

    def __init__(self, executable: str, profile: Path) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="playwright")
        self.pool.submit(self._start, executable, profile).result(timeout=120)

    def _start(self, executable: str, profile: Path) -> None:
        from playwright.sync_api import sync_playwright

        self.pw = sync_playwright().start()
        self.context = self.pw.chromium.launch_persistent_context(
            str(profile), executable_path=executable, headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1200, "height": 800})
        self.context.set_default_timeout(15_000)

    def check(self, shots: Path, fn: Callable[[Any], None]) -> None:
        """Run ``fn(page)`` on a fresh page (a tab: its own sessionStorage); if it fails, screenshot every view."""
        self.pool.submit(self._check, shots, fn).result(timeout=240)

    def _check(self, shots: Path, fn: Callable[[Any], None]) -> None:
        page = self.context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            fn(page)
            assert errors == [], f"JavaScript errors on the page: {errors}"
        except BaseException:
            self._screenshots(page, shots)
            raise
        finally:
            page.close()

    @staticmethod
    def _screenshots(page: Any, shots: Path) -> None:
        shots.mkdir(parents=True, exist_ok=True)
        base = page.url.split("#")[0]
        for view in VIEWS:
            try:
                page.goto(f"{base}#{view}")
                page.wait_for_timeout(1000)
                page.screenshot(path=str(shots / f"{view}.png"), full_page=True)
            except Exception as exc:  # a screenshot helps the reader; its failure must not hide the test's own
                print(f"screenshot of {view} failed: {exc}")
        print(f"screenshots of every view: {shots}")

    def close(self) -> None:
        def stop() -> None:
            self.context.close()
            self.pw.stop()

        self.pool.submit(stop).result(timeout=60)
        self.pool.shutdown()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    path = chromium_path()
    if path is None:
        message = f"Chromium not found for the dashboard's browser tests: {INSTALL_HINT}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        print(f"\n{'!' * 100}\nSKIPPING BROWSER TESTS. {message}\n{'!' * 100}")
        pytest.skip(message)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.fail("playwright is not installed: pip install -e '.[test]'")
    b = Browser(path, tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


@pytest.fixture
def seeded(redis: redis_lib.Redis, prefix: str, mongo_uri: str,
           mongo_db: str) -> Iterator[tuple[Store, dict[str, str]]]:
    store = Store(redis, Keys(prefix))
    client: pymongo.MongoClient = pymongo.MongoClient(mongo_uri, serverSelectionTimeoutMS=5000)
    yield store, seed(store, client[mongo_db]["items"])
    client.close()


@pytest.fixture
def dashboard(scrapy_env: dict[str, str], prefix: str, mongo_db: str, tmp_path: Path,
              seeded: Any) -> Iterator[Any]:
    """``dashboard(token=None)`` starts one on the seeded deployment; returns its URL."""
    procs = []

    def start(token: str | None = None) -> str:
        env = dict(scrapy_env, **({"PC_DASHBOARD_TOKEN": token} if token else {}))
        procs.append(start_dashboard(env, prefix, mongo_db, tmp_path / f"dashboard{len(procs)}.log"))
        return str(procs[-1].url)

    yield start
    for p in procs:
        p.stop()


def open_view(page: Any, url: str, view: str) -> None:
    page.goto(f"{url}#{view}")
    page.wait_for_selector(f"#view-{view} [data-ready={view}]")


def test_matrix_shows_the_completion_of_every_site_and_node_and_follows_new_runs(
        browser: Browser, dashboard: Any, seeded: Any, tmp_path: Path) -> None:
    store, _ = seeded
    url = dashboard()

    def check(page: Any) -> None:
        from playwright.sync_api import expect

        open_view(page, url, "matrix")
        for (site, node), value in EXPECTED.items():
            cell = page.locator(f"#matrix td.cell[data-site='{site}'][data-node='{node}']")
            assert cell.locator(".c").inner_text() == value
            assert cell.locator(".r").inner_text() == "1 run"
        assert page.locator("#matrix td[data-site='a.example'][data-node='node3']").inner_text() == "–"
        page.locator("#matrix td.cell[data-site='a.example'][data-node='node2']").click()
        detail = page.locator("#cell-detail")
        detail.wait_for()
        assert "results collected" in detail.inner_text() and "光明高钙牛奶" in detail.inner_text()
        assert "Completion on a.example over time" in detail.inner_text()
        run(store, "node3", "a.example", 40, 30, 4, 2.0, True)  # a new run: the open page follows, no reload
        expect(page.locator("#matrix td[data-site='a.example'][data-node='node3'] .c")).to_have_text("0.75")

    browser.check(tmp_path / "screenshots", check)


def test_requeue_by_clicking_removes_the_entry_and_audits_it(browser: Browser, dashboard: Any, seeded: Any,
                                                             tmp_path: Path) -> None:
    store, ids = seeded
    url = dashboard(TOKEN)

    def check(page: Any) -> None:
        open_view(page, url, "deadletters")
        page.fill("#token", TOKEN)
        page.click("#sign-in")
        page.wait_for_selector("text=operator: token")
        row = page.locator(f"#deadletters tr[data-id='{ids['subtask']}']")
        page.once("dialog", lambda dialog: dialog.accept())
        row.locator("button.requeue").click()
        row.wait_for(state="detached")
        assert page.locator("#audit tbody tr").count() == 1 and "requeue" in page.locator("#audit").inner_text()
        assert page.locator(f"#deadletters tr[data-id='{ids['report']}'] button.requeue").count() == 0  # drop only

    browser.check(tmp_path / "screenshots", check)
    assert store.redis.zscore(store.keys.waiting, ids["subtask"]) is not None
    assert not store.redis.hexists(store.keys.dead, ids["subtask"]) and store.redis.llen(store.keys.audit) == 1


def test_read_only_page_has_no_action_buttons(browser: Browser, dashboard: Any, seeded: Any, tmp_path: Path) -> None:
    _, ids = seeded
    url = dashboard()

    def check(page: Any) -> None:
        open_view(page, url, "deadletters")
        assert page.locator(f"#deadletters tr[data-id='{ids['subtask']}']").count() == 1
        assert page.locator("#view-deadletters button").count() == 0
        assert "Read-only" in page.locator("#read-only").inner_text()
        assert "blocked: 403" in page.locator("#failures").inner_text()  # the seeded failed run, recalled
        assert page.locator("#token").count() == 0  # nothing to sign in to

    browser.check(tmp_path / "screenshots", check)


def test_wrong_token_is_refused(browser: Browser, dashboard: Any, seeded: Any, tmp_path: Path) -> None:
    store, _ = seeded
    url = dashboard(TOKEN)

    def check(page: Any) -> None:
        open_view(page, url, "deadletters")
        page.fill("#token", "not-the-token-0123456789")
        page.click("#sign-in")
        page.wait_for_selector("#refused")
        open_view(page, url, "deadletters")
        assert page.locator("#view-deadletters button").count() == 0

    browser.check(tmp_path / "screenshots", check)
    assert store.redis.hlen(store.keys.dead) == 2


def test_cluster_products_and_items_views(browser: Browser, dashboard: Any, tmp_path: Path) -> None:
    url = dashboard()

    def check(page: Any) -> None:
        from playwright.sync_api import expect

        open_view(page, url, "cluster")
        assert page.locator("tr[data-node]").count() == 3 and page.locator("tr[data-node] .pill.ok").count() == 3
        open_view(page, url, "products")
        page.locator(f"tr[data-product='{PRODUCT}']").click()
        page.wait_for_selector("text=Recent runs")
        text = page.locator("#view-products").inner_text()
        assert "1 / 3" in text and "12.5" in text  # tasks done / total; the task's current time limit
        assert page.locator("#view-products table").nth(2).locator("tbody tr").count() == 3  # the three runs
        open_view(page, url, "items")
        page.fill("input[name=q]", "质量")
        page.click("form.filters button[type=submit]")
        expect(page.locator("#items tbody tr")).to_have_count(4)
        hrefs = {a.get_attribute("href") for a in page.locator("#items a").all()}
        assert hrefs == {"http://a.example/item/1", "http://a.example/item/3", "http://a.example/item/5",
                         "http://b.example/item/7"}  # links to the source pages

    browser.check(tmp_path / "screenshots", check)
