#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Drives the console's Tasks pages in headless Chromium (python3-selenium, chromium-driver).

    console_tasks_browser.py URL OUT_DIR OPERATOR_TOKEN TENANT_TOKEN OWN_TASK OTHER_TASK NSTEPS

As the operator: the tasks page lists both tasks with the counts by status; OWN_TASK's page
shows its NSTEPS steps in order, each with a call link, and a link leads to the call's page.
As the tenant (owner of OWN_TASK): OTHER_TASK is not listed and its page is not found. A
screenshot of each page goes to OUT_DIR. Exit 0 when every check holds; a failed check raises.
"""
import os
import sys
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

URL, OUT, OP_TOKEN, TEN_TOKEN, OWN_TASK, OTHER_TASK, NSTEPS = sys.argv[1:8]
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
    WebDriverWait(d, 20).until(lambda x: x.current_url.rstrip("/") == URL.rstrip("/") or
                               "#/" in x.current_url)
    ready(d, "#/calls")


def shot(d, name):
    time.sleep(0.3)
    d.save_screenshot(os.path.join(OUT, name + ".png"))
    print("screenshot", os.path.join(OUT, name + ".png"))


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what)


def task_ids(d):
    return [r.get_attribute("data-task-id")
            for r in d.find_elements(By.CSS_SELECTOR, "#tasks tbody tr[data-task-id]")]


def as_operator():
    with tempfile.TemporaryDirectory() as prof:
        d = browser(prof)
        try:
            login(d, OP_TOKEN)
            d.get(URL + "#/tasks")
            ready(d, "#/tasks")
            ids = task_ids(d)
            check(OWN_TASK in ids and OTHER_TASK in ids,
                  "operator: the tasks page lists the tasks (%d rows)" % len(ids))
            check(d.find_elements(By.CSS_SELECTOR, '#task-counts a[data-status="succeeded"]'),
                  "operator: the counts by status are shown")
            shot(d, "tasks")
            d.find_element(By.CSS_SELECTOR, 'a.task-link[href="#/task/%s"]' % OWN_TASK).click()
            ready(d, "#/task/")
            steps = d.find_elements(By.CSS_SELECTOR, "#task-steps tr.step")
            links = [s.find_element(By.CSS_SELECTOR, "a.call-link").text for s in steps]
            check(len(steps) == int(NSTEPS) and all(x.startswith("c_") for x in links),
                  "task page: %s steps, each with its call id %s" % (NSTEPS, links))
            check(d.find_elements(By.CSS_SELECTOR, "#task-timeline tbody tr"),
                  "task page: the timeline of its calls")
            shot(d, "task")
            steps[0].find_element(By.CSS_SELECTOR, "a.call-link").click()
            ready(d, "#/call/")
            check(d.find_elements(By.CSS_SELECTOR, "#timeline td.event"),
                  "a step's call link opens the call's page")
        finally:
            d.quit()


def as_tenant():
    with tempfile.TemporaryDirectory() as prof:
        d = browser(prof)
        try:
            login(d, TEN_TOKEN)
            d.get(URL + "#/tasks")
            ready(d, "#/tasks")
            ids = task_ids(d)
            check(OWN_TASK in ids and OTHER_TASK not in ids,
                  "tenant: its own task listed, not another tenant's (%s)" % ids)
            shot(d, "tenant-tasks")
            d.get(URL + "#/task/" + OTHER_TASK)
            ready(d, "#/task/")
            check(d.find_elements(By.ID, "not-found"),
                  "tenant: another tenant's task page is not found")
        finally:
            d.quit()


as_operator()
as_tenant()
print("browser checks passed")
