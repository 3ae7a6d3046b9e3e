#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The console's dead webhook deliveries in headless Chromium (test_console_webhooks).
    console_webhooks_browser.py URL OUT_DIR OPERATOR_TOKEN TENANT_TOKEN OWN_DELIVERY OTHER_DELIVERY
As the tenant: the dead-letters page lists OWN_DELIVERY, not OTHER_DELIVERY (another tenant's),
and offers no redrive. As the operator: both are listed, OWN_DELIVERY is redriven from its
button (the page sends the CSRF token) and the page says so. A screenshot of each page goes to
OUT_DIR. Exit 0 when every check holds; a failed check raises.
"""
import os
import sys
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

URL, OUT, OP_TOKEN, TEN_TOKEN, OWN, OTHER = sys.argv[1:7]
os.makedirs(OUT, exist_ok=True)


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
    WebDriverWait(d, timeout).until(
        lambda x: (x.find_element(By.TAG_NAME, "body").get_attribute("data-ready") or "")
        .startswith(hash_prefix))


def login(d, token):
    d.get(URL + "login.html")
    d.find_element(By.ID, "token").send_keys(token)
    d.find_element(By.ID, "login").click()
    WebDriverWait(d, 20).until(lambda x: "#/" in x.current_url or
                               x.current_url.rstrip("/") == URL.rstrip("/"))
    ready(d, "#/calls")


def shot(d, name):
    time.sleep(0.3)
    d.save_screenshot(os.path.join(OUT, name + ".png"))
    print("screenshot", os.path.join(OUT, name + ".png"))


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what)


def listed(d):
    d.get(URL + "#/dlq")
    ready(d, "#/dlq")
    return [r.get_attribute("data-delivery-id")
            for r in d.find_elements(By.CSS_SELECTOR, "#dlq-webhooks tbody tr[data-delivery-id]")]


def run(token, fn):
    with tempfile.TemporaryDirectory() as prof:
        d = browser(prof)
        try:
            login(d, token)
            fn(d)
        finally:
            d.quit()


def as_tenant(d):
    ids = listed(d)
    check(OWN in ids and OTHER not in ids, "tenant: its own dead delivery only (%s)" % ids)
    check(not d.find_elements(By.CSS_SELECTOR, "button.wh-redrive-btn"), "tenant: no redrive button")
    shot(d, "tenant-dlq-webhooks")


def as_operator(d):
    ids = listed(d)
    check(OWN in ids and OTHER in ids, "operator: every dead delivery (%d)" % len(ids))
    shot(d, "dlq-webhooks")
    row = d.find_element(By.CSS_SELECTOR, '#dlq-webhooks tr[data-delivery-id="%s"]' % OWN)
    row.find_element(By.CSS_SELECTOR, "button.wh-redrive-btn").click()
    WebDriverWait(d, 20).until(EC.text_to_be_present_in_element((By.ID, "msg"), "redriven"))
    check(OWN in d.find_element(By.ID, "msg").text, "operator: redriven from the page")
    shot(d, "dlq-webhooks-redriven")


run(TEN_TOKEN, as_tenant)
run(OP_TOKEN, as_operator)
