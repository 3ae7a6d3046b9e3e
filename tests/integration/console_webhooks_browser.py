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

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from consolelib import check, ready, session, shot  # noqa: E402

URL, OUT, OP_TOKEN, TEN_TOKEN, OWN, OTHER = sys.argv[1:7]
os.makedirs(OUT, exist_ok=True)


def listed(d):
    d.get(URL + "#/dlq")
    ready(d, "#/dlq")
    return [r.get_attribute("data-delivery-id")
            for r in d.find_elements(By.CSS_SELECTOR, "#dlq-webhooks tbody tr[data-delivery-id]")]


def run(token, fn):
    with session(URL, token) as d:
        fn(d)


def as_tenant(d):
    ids = listed(d)
    check(OWN in ids and OTHER not in ids, "tenant: its own dead delivery only (%s)" % ids)
    check(not d.find_elements(By.CSS_SELECTOR, "button.wh-redrive-btn"), "tenant: no redrive button")
    shot(d, OUT, "tenant-dlq-webhooks")


def as_operator(d):
    ids = listed(d)
    check(OWN in ids and OTHER in ids, "operator: every dead delivery (%d)" % len(ids))
    shot(d, OUT, "dlq-webhooks")
    row = d.find_element(By.CSS_SELECTOR, '#dlq-webhooks tr[data-delivery-id="%s"]' % OWN)
    row.find_element(By.CSS_SELECTOR, "button.wh-redrive-btn").click()
    WebDriverWait(d, 20).until(EC.text_to_be_present_in_element((By.ID, "msg"), "redriven"))
    check(OWN in d.find_element(By.ID, "msg").text, "operator: redriven from the page")
    shot(d, OUT, "dlq-webhooks-redriven")


run(TEN_TOKEN, as_tenant)
run(OP_TOKEN, as_operator)
