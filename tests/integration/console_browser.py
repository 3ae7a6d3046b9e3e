#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Drives `onceq console` in headless Chromium (python3-selenium, Debian's chromium-driver).

    console_browser.py URL OUT_DIR OPERATOR_TOKEN TENANT_TOKEN REVIEW_CALL OTHER_CALL OWN_CALL

As the operator (logged in through the form): the calls page lists the calls, a call's page
shows its timeline (producer and consumer rows, the downstream id), the review page resolves
REVIEW_CALL as committed; charts and dead letters render. As the tenant: its own call is
listed, OTHER_CALL (another tenant's) is neither listed nor found by id. A screenshot of each
page goes to OUT_DIR. Exit 0 when every check holds; a failed check raises.
"""
import os
import sys
import time

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from consolelib import check, ready, session, shot  # noqa: E402

URL, OUT, OP_TOKEN, TEN_TOKEN, REVIEW_CALL, OTHER_CALL, OWN_CALL = sys.argv[1:8]
os.makedirs(OUT, exist_ok=True)


def as_operator():
    with session(URL, OP_TOKEN) as d:
        rows = d.find_elements(By.CSS_SELECTOR, "#calls tbody tr[data-call-id]")
        ids = [r.get_attribute("data-call-id") for r in rows]
        check(REVIEW_CALL in ids and OTHER_CALL in ids and OWN_CALL in ids,
              "operator: the calls page lists the calls (%d rows)" % len(ids))
        shot(d, OUT, "calls")
        # filter by status
        Select(d.find_element(By.ID, "f-status")).select_by_value("needs_review")
        d.find_element(By.ID, "apply").click()
        ready(d, "#/calls?status=needs_review")
        ids = [r.get_attribute("data-call-id")
               for r in d.find_elements(By.CSS_SELECTOR, "#calls tbody tr[data-call-id]")]
        check(ids == [REVIEW_CALL], "operator: the status filter shows the call in review")
        # one call's timeline
        d.find_element(By.CSS_SELECTOR, 'a.call-link[href="#/call/%s"]' % REVIEW_CALL).click()
        ready(d, "#/call/")
        events = [e.text for e in d.find_elements(By.CSS_SELECTOR, "#timeline td.event")]
        froms = {e.text for e in d.find_elements(By.CSS_SELECTOR, "#timeline td:nth-child(2)")}
        check("submitted" in events and "unknown" in events,
              "call page: timeline with the producer's and consumer's events %s" % events)
        check(froms == {"producer", "consumer"}, "call page: both sources in the timeline")
        shot(d, OUT, "call")
        # the review queue: resolve as committed
        d.get(URL + "#/review")
        ready(d, "#/review")
        row = d.find_element(By.CSS_SELECTOR, '#review tr[data-call-id="%s"]' % REVIEW_CALL)
        shot(d, OUT, "review")
        # what a forged request can do with the session cookie alone: no CSRF token, refused
        fence = int(row.find_element(By.CSS_SELECTOR, "td.fence").text)
        status = d.execute_async_script("""
            const done = arguments[arguments.length - 1];
            fetch('/api/review/' + arguments[0] + '/resolve', {method: 'POST',
                  credentials: 'same-origin', headers: {'Content-Type': 'application/json'},
                  body: JSON.stringify({as: 'failed', fence: arguments[1], note: 'forged'})})
              .then(r => done(r.status), e => done(String(e)));""", REVIEW_CALL, fence)
        check(status == 403, "review page: a resolve without the CSRF token is refused (%s)"
              % status)
        Select(row.find_element(By.NAME, "as")).select_by_value("committed")
        row.find_element(By.NAME, "note").send_keys("payment seen in the provider dashboard")
        row.find_element(By.CSS_SELECTOR, "button.resolve-btn").click()
        WebDriverWait(d, 20).until(EC.text_to_be_present_in_element((By.ID, "msg"), "resolved"))
        check("resolved " + REVIEW_CALL in d.find_element(By.ID, "msg").text,
              "review page: resolved from the page")
        shot(d, OUT, "review-resolved")
        d.get(URL + "#/dlq")
        ready(d, "#/dlq")
        check(d.find_elements(By.ID, "dlq"), "dead letters page renders")
        shot(d, OUT, "dlq")
        d.get(URL + "#/charts")
        ready(d, "#/charts")
        time.sleep(5)  # a few samples, so rates have two points
        check(len(d.find_elements(By.CSS_SELECTOR, ".chart svg polyline")) >= 7,
              "charts page: SVG charts drawn from the daemons' metrics")
        shot(d, OUT, "charts")


def as_tenant():
    with session(URL, TEN_TOKEN) as d:
        ids = [r.get_attribute("data-call-id")
               for r in d.find_elements(By.CSS_SELECTOR, "#calls tbody tr[data-call-id]")]
        check(OWN_CALL in ids, "tenant: its own call is listed")
        check(OTHER_CALL not in ids, "tenant: another tenant's call is not listed")
        shot(d, OUT, "tenant-calls")
        d.get(URL + "#/calls?q=" + OTHER_CALL)
        ready(d, "#/calls?q=")
        check(not d.find_elements(By.CSS_SELECTOR, "#calls tbody tr[data-call-id]"),
              "tenant: a search by the other tenant's call id finds nothing")
        d.get(URL + "#/call/" + OTHER_CALL)
        ready(d, "#/call/")
        check(d.find_elements(By.ID, "not-found"),
              "tenant: another tenant's call page is not found")
        shot(d, OUT, "tenant-other-call")


as_operator()
as_tenant()
print("browser checks passed")
