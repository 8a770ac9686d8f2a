"""The web console in a real browser: headless Chromium (the system's package) driven by
Selenium against `phpmq web` and a real broker. Each test saves screenshots of the pages it
sees under its tmp_path (and in $WEB_SCREENSHOTS, which docs/images is made from)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import BrokerProcess
from web_harness import PASSWORDS, browser_or_skip, console, screenshot, write_users

pytestmark = pytest.mark.timeout(180)
WAIT_S = 15


@pytest.fixture
def driver() -> Iterator[Any]:
    browser = browser_or_skip()
    browser.set_page_load_timeout(30)
    try:
        yield browser
    finally:
        browser.quit()


def waiter(driver: Any) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # The pages replace their tables live: an element read between two updates is stale,
    # which only means "look again".
    return WebDriverWait(
        driver, WAIT_S, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
    )


def until(driver: Any, check: Any) -> Any:
    """`check(driver)`'s first true value within WAIT_S; else the test fails showing the page
    as it was (a bare TimeoutException says nothing of what the browser saw)."""
    from selenium.common.exceptions import TimeoutException

    try:
        return waiter(driver).until(check)
    except TimeoutException:
        shown = driver.execute_script("return document.body ? document.body.innerText : ''")
        raise AssertionError(
            f"not so within {WAIT_S} s at {driver.current_url}; the page shows:\n{shown[:2000]}"
        ) from None


def by_css(driver: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def all_css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def ready_cell(driver: Any, queue: str) -> str:
    cells = all_css(driver, f'tr[data-queue="{queue}"] td.ready')
    return cells[0].text if cells else ""


def log_in(driver: Any, url: str, name: str) -> None:
    driver.get(url + "/")
    until(driver, lambda d: "/login" in d.current_url)
    by_css(driver, "#login-name").send_keys(name)
    by_css(driver, "#login-password").send_keys(PASSWORDS[name])
    by_css(driver, "#login").click()
    until(driver, lambda d: "/login" not in d.current_url)


def test_the_queue_table_updates_live_and_every_page_shows(
    broker: BrokerProcess, driver: Any, tmp_path: Path
) -> None:
    shots = tmp_path / "screenshots"
    with broker.client() as client:
        client.send("orders", b'{"id": 17, "total": 9.5}', confirm=True)
        client.bind("billing", "order.*")
        client.bind("audit", "#")
        client.schedule("tick", "ticks", b"tick", every=60, nohaste=True)
    with console(broker.address, tmp_path / "web.log") as web:
        driver.get(web.url + "/queues")
        until(driver, lambda d: ready_cell(d, "orders") == "1")
        driver.execute_script("window.notReloaded = true")
        with broker.client() as client:
            client.send_many("orders", [b"second", b"third"], confirm=True)
        until(driver, lambda d: ready_cell(d, "orders") == "3")
        assert driver.execute_script("return window.notReloaded === true"), "the page reloaded"
        screenshot(driver, shots, "queues")
        for path, name, shows in (
            ("/", "overview", "Counters since start"),
            ("/queue?name=orders", "queue", '"total": 9.5'),
            ("/events", "events", "order.*"),
            ("/schedules", "schedules", "tick"),
            ("/peers", "peers", "phpmq-web"),
        ):
            driver.get(web.url + path)
            until(driver, lambda d, shows=shows: shows in by_css(d, "main").text)
            screenshot(driver, shots, name)
    assert {p.name for p in shots.iterdir()} >= {"queues.png", "overview.png", "queue.png"}


def test_peek_shows_markup_as_text_and_runs_nothing(
    broker: BrokerProcess, driver: Any, tmp_path: Path
) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    with broker.client() as client:
        client.send("xss", b"<script>alert(1)</script>", confirm=True)
        client.send("xss", b"<img src=x onerror=alert(2)>", confirm=True)
    with console(broker.address, tmp_path / "web.log") as web:
        driver.get(web.url + "/queue?name=xss")
        contents = [element.text for element in all_css(driver, "tr.message pre.content")]
        assert contents == ["<script>alert(1)</script>", "<img src=x onerror=alert(2)>"]
        assert not all_css(driver, "main script") and not all_css(driver, "main img")
        driver.execute_script("window.notReloaded = true")
        until(driver, lambda d: d.execute_script("return !!document.body.dataset.refreshed"))
        assert not all_css(driver, "main script")  # nor after a live update
        with pytest.raises(NoAlertPresentException):
            driver.switch_to.alert.text  # noqa: B018
        screenshot(driver, tmp_path / "screenshots", "peek")


def test_purge_asks_and_then_purges(broker: BrokerProcess, driver: Any, tmp_path: Path) -> None:
    with broker.client() as client:
        client.send_many("orders", [b"a", b"b", b"c"], confirm=True)
    with console(broker.address, tmp_path / "web.log") as web:
        driver.get(web.url + "/queue?name=orders")
        by_css(driver, "#purge").click()
        until(driver, lambda d: "Purge queue orders?" in by_css(d, "h1").text)
        assert "3 ready" in by_css(driver, "main").text
        screenshot(driver, tmp_path / "screenshots", "purge-question")
        assert broker.stats()["queues"]["orders"]["ready"] == 3  # asking changed nothing
        by_css(driver, "#cancel").click()
        until(driver, lambda d: d.current_url.endswith("/queue?name=orders"))
        assert broker.stats()["queues"]["orders"]["ready"] == 3
        by_css(driver, "#purge").click()
        by_css(driver, "#confirm").click()
        until(driver, lambda d: "purged 3 messages from orders" in d.page_source)
        assert broker.stats()["queues"]["orders"]["ready"] == 0
        screenshot(driver, tmp_path / "screenshots", "purged")


def test_with_users_a_login_comes_first(broker: BrokerProcess, driver: Any, tmp_path: Path) -> None:
    users = write_users(tmp_path / "users.toml")
    with console(broker.address, tmp_path / "web.log", "--users", str(users)) as web:
        driver.get(web.url + "/queues")
        until(driver, lambda d: "/login" in d.current_url)
        screenshot(driver, tmp_path / "screenshots", "login")
        by_css(driver, "#login-name").send_keys("alice")
        by_css(driver, "#login-password").send_keys("a wrong password")
        by_css(driver, "#login").click()
        until(driver, lambda d: "wrong name or password" in d.page_source)
        by_css(driver, "#login-name").send_keys("alice")
        by_css(driver, "#login-password").send_keys(PASSWORDS["alice"])
        by_css(driver, "#login").click()
        until(driver, lambda d: d.current_url.endswith("/queues"))  # back where it was
        assert "alice" in by_css(driver, "header .user").text


def test_a_read_only_user_has_no_purge_and_the_endpoint_refuses(
    broker: BrokerProcess, driver: Any, tmp_path: Path
) -> None:
    with broker.client() as client:
        client.send("orders", b"keep me", confirm=True)
    users = write_users(tmp_path / "users.toml")
    with console(broker.address, tmp_path / "web.log", "--users", str(users)) as web:
        log_in(driver, web.url, "bob")
        driver.get(web.url + "/queue?name=orders")
        until(driver, lambda d: "keep me" in by_css(d, "main").text)
        assert not all_css(driver, "#purge") and not all_css(driver, "#delete")
        assert not all_css(driver, "form.send")
        screenshot(driver, tmp_path / "screenshots", "read-only")
        # The endpoint itself, asked with bob's session and its valid CSRF token.
        status, text = driver.execute_async_script(
            """
            const done = arguments[arguments.length - 1];
            const form = new URLSearchParams({name: "orders",
                csrf: document.querySelector('meta[name="csrf"]').content});
            fetch("/queue/purge", {method: "POST", body: form, credentials: "same-origin"})
              .then(async (answer) => done([answer.status, await answer.text()]));
            """
        )
        assert status == 403 and "read role" in text
        assert broker.stats()["queues"]["orders"]["ready"] == 1
