"""Headless Chromium for the browser tests (``tests/ui``): where Debian's Chromium and WebDriver are, screenshots
under ``test-artifacts/browser/``, waiting for what a page shows, and a folder served over HTTP."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.projects import PROJECT

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = PROJECT / "test-artifacts" / "browser"
PAGE_TIMEOUT_S = 90  # a page's scripts, on 2 shared cores


def before_each_page(driver: webdriver.Chrome, script: str) -> None:
    """Run ``script`` in every page before the page's own scripts (to preset its localStorage)."""
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": script})


def screenshot(driver: webdriver.Chrome, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"{name}_failed.png").unlink(missing_ok=True)  # from an earlier run, no longer true
    path = ARTIFACTS / f"{name}.png"
    assert driver.save_screenshot(str(path)), path
    print(f"screenshot: {path}")
    return path


def wait_for(driver: webdriver.Chrome, condition: Callable, name: str, what: str):
    """``condition``'s first truthy value within PAGE_TIMEOUT_S; on timeout a ``<name>_failed`` screenshot, a fail."""
    try:
        # an element read while the page re-renders goes stale: the condition is asked again
        wait = WebDriverWait(
            driver, PAGE_TIMEOUT_S, poll_frequency=0.5, ignored_exceptions=(StaleElementReferenceException,)
        )
        return wait.until(condition)
    except TimeoutException:
        path = screenshot(driver, f"{name}_failed")
        body = driver.find_element(By.TAG_NAME, "body").text
        pytest.fail(f"{what} not shown within {PAGE_TIMEOUT_S} s at {driver.current_url} ({path}); page text:\n{body}")


def settled_screenshot(driver: webdriver.Chrome, name: str) -> Path:
    """A screenshot once the page's animations (fade-ins, drawn lines) have finished; looping ones (kedro-viz's
    pulsing markers) never do and are not waited for."""
    still = "a => a.playState !== 'running' || a.effect.getComputedTiming().iterations === Infinity"
    wait_for(
        driver,
        lambda d: d.execute_script(f"return document.getAnimations().every({still})"),
        name,
        "a still page",
    )
    return screenshot(driver, name)


@contextlib.contextmanager
def static_site(folder: Path) -> Iterator[str]:
    """``folder`` served over HTTP on a free localhost port; yields the base URL."""

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
