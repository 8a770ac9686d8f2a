"""The web console for tests: `phpmq web` as a real process next to a real broker, a users
file, HTTP requests with a session (urllib), and headless Chromium driven by Selenium.

Chromium and its driver are the system's packages (`chromium`, `chromium-driver`); Selenium
is told both paths, so its manager never looks for (or downloads) a browser. Without them
the browser tests skip, except in CI (CI=true), where `make test` installs them and a
missing one fails.
"""

from __future__ import annotations

import http.cookiejar
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from harness import REPO

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
#: Copy the screenshots here too (docs/images when the docs' pictures are renewed).
SCREENSHOTS_VARIABLE = "WEB_SCREENSHOTS"
#: For the tests' self-signed certificates.
UNVERIFIED = ssl._create_unverified_context()
PASSWORDS = {"alice": "alice's long password", "bob": "bob's long password"}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def write_users(path: Path) -> Path:
    """alice (admin) and bob (read), with PASSWORDS."""
    from phpmq.web.users import hash_password

    path.write_text(
        f'[users.alice]\nrole = "admin"\npassword = "{hash_password(PASSWORDS["alice"])}"\n\n'
        f'[users.bob]\nrole = "read"\npassword = "{hash_password(PASSWORDS["bob"])}"\n'
    )
    return path


class ConsoleProcess:
    """`phpmq web` on a loopback port it picks itself (and reports: its first line says where
    it listens, so no port is raced), answering with the broker's figures when constructed;
    SIGTERM at the end."""

    def __init__(self, broker: str, log_path: Path, *flags: str) -> None:
        self.scheme = "https" if "--certfile" in flags else "http"
        self.log_path = log_path
        command = [
            sys.executable, "-m", "phpmq", "web", "--broker", broker,
            "--bind", "127.0.0.1:0", "--interval", "0.5", *flags,
        ]  # fmt: skip
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        self.port = self._reported_port()
        self.url = f"{self.scheme}://127.0.0.1:{self.port}"
        self._wait_until_answering()

    def _reported_port(self) -> int:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            found = re.search(rf"phpmq web: {self.scheme}://127\.0\.0\.1:(\d+)/", self.log())
            if found:
                return int(found.group(1))
            if self.process.poll() is not None:
                raise AssertionError(f"phpmq web exited: {self.log()}")
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"phpmq web did not say where it listens: {self.log()}")

    def _wait_until_answering(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"phpmq web exited: {self.log()}")
            try:
                with urllib.request.urlopen(
                    f"{self.url}/login", timeout=1, context=UNVERIFIED
                ) as answer:
                    page = answer.read().decode()
                if 'id="login"' in page:
                    return  # with users: the figures are behind the login
                if 'id="status"' in page and "the broker's first answer" not in page:
                    return  # its first poll is in: every page has the broker's figures
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"phpmq web did not answer with the broker's figures: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


@contextmanager
def console(broker: str, log_path: Path, *flags: str) -> Iterator[ConsoleProcess]:
    process = ConsoleProcess(broker, log_path, *flags)
    try:
        yield process
    finally:
        process.stop()
        print(f"--- {log_path.name}:\n{process.log()}")  # shown if the test failed


class Session:
    """HTTP requests with cookies, as a browser without JavaScript makes them; redirects
    are not followed, so that a test sees them."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.cookies = http.cookiejar.CookieJar()

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: Any, **kwargs: Any) -> None:
                return None

        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.cookies),
            urllib.request.HTTPSHandler(context=UNVERIFIED),
            NoRedirect(),
        )

    def request(self, path: str, form: dict[str, str] | None = None) -> tuple[int, Any, str]:
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        try:
            with self.opener.open(self.base + path, data=data, timeout=10) as answer:
                return answer.status, answer.headers, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, exc.read().decode()

    def csrf(self, path: str = "/") -> str:
        """The CSRF token a page of the session carries in its forms."""
        _, _, page = self.request(path)
        found = re.search(r'name="csrf" (?:value|content)="([^"]+)"', page)
        assert found, page
        return found.group(1)

    def log_in(self, name: str) -> None:
        token = self.csrf("/login")
        status, _, _ = self.request(
            "/login", {"csrf": token, "name": name, "password": PASSWORDS[name]}
        )
        assert status == 303, status


def browser_or_skip() -> Any:
    """A headless Chromium (the system's) under Selenium, or a skip saying what is missing."""
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium (pip install 'phpmq-zmq[web]')")
    if missing:
        reason = "the browser tests need " + ", ".join(missing) + " (apt-get install chromium"
        reason += " chromium-driver)"
        if in_ci():
            pytest.fail(f"{reason}: make test installs them in CI", pytrace=False)
        pytest.skip(reason)
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager, should it run, downloads nothing
    options = Options()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--window-size=1280,1000", "--hide-scrollbars", "--lang=en-US",
    ):  # fmt: skip
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)


def screenshot(driver: Any, directory: Path, name: str) -> Path:
    """The whole page as directory/NAME.png (and in $WEB_SCREENSHOTS, if set)."""
    directory.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, max(700, min(int(height) + 20, 2400)))
    path = directory / f"{name}.png"
    driver.save_screenshot(str(path))
    driver.set_window_size(1280, 1000)
    copies = os.environ.get(SCREENSHOTS_VARIABLE)
    if copies:
        Path(copies).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(copies) / path.name)
    return path
