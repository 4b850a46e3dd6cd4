"""Fixtures of the browser tests: Chromium present (or the tests fail in CI and skip elsewhere), and a headless
Chromium per test."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from tests.support.browser import CHROMEDRIVER, CHROMIUM, PAGE_TIMEOUT_S


@pytest.fixture(scope="module", autouse=True)
def chromium_installed() -> None:
    """Fails in CI (``CI`` set) and skips elsewhere, before any work, when Chromium or its WebDriver is missing."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        reason = f"{', '.join(missing)} not installed: run scripts/setup.sh (Debian chromium, chromium-driver)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    """Headless Debian Chromium driven by Debian's chromedriver, quit after the test."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(PAGE_TIMEOUT_S)
    driver.set_script_timeout(PAGE_TIMEOUT_S)
    try:
        yield driver
    finally:
        driver.quit()
