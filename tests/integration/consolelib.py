# SPDX-License-Identifier: Apache-2.0
"""What the console's browser tests share: a headless Chromium (Debian's chromium and
chromium-driver, python3-selenium), the console's "page ready" mark, the login form,
screenshots and checks that print what held."""
import contextlib
import os
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait


def browser(profile):
    o = webdriver.ChromeOptions()
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", "--window-size=1400,900", "--user-data-dir=" + profile):
        o.add_argument(a)
    o.binary_location = "/usr/bin/chromium"
    d = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=o)
    d.set_page_load_timeout(30)
    return d


def ready(d, hash_prefix, timeout=20):
    """Wait until the page drawn for a route starting with hash_prefix says it is ready."""
    WebDriverWait(d, timeout).until(
        lambda x: (x.find_element(By.TAG_NAME, "body").get_attribute("data-ready") or "")
        .startswith(hash_prefix))


def login(d, url, token):
    d.get(url + "login.html")
    d.find_element(By.ID, "token").send_keys(token)
    d.find_element(By.ID, "login").click()
    WebDriverWait(d, 20).until(lambda x: x.current_url.rstrip("/") == url.rstrip("/") or
                               "#/" in x.current_url)
    ready(d, "#/calls")


@contextlib.contextmanager
def session(url, token):
    """A fresh headless Chromium (its own profile) logged in with token; quit on the way out."""
    with tempfile.TemporaryDirectory() as prof:
        d = browser(prof)
        try:
            login(d, url, token)
            yield d
        finally:
            d.quit()


def shot(d, out, name):
    time.sleep(0.3)
    d.save_screenshot(os.path.join(out, name + ".png"))
    print("screenshot", os.path.join(out, name + ".png"))


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what)
