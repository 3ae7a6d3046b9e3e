#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Drives the console's Tasks pages in headless Chromium (python3-selenium, chromium-driver).

    console_tasks_browser.py URL OUT_DIR OPERATOR_TOKEN TENANT_TOKEN OWN_TASK OTHER_TASK NSTEPS
                             [APPROVAL_TASK]

As the operator: the tasks page lists both tasks with the counts by status; OWN_TASK's page
shows its NSTEPS steps in order, each with a call link, and a link leads to the call's page.
As the tenant (owner of OWN_TASK): OTHER_TASK is not listed and its page is not found; the page
of APPROVAL_TASK (its own, awaiting approval) offers it no decision. Then the operator approves
APPROVAL_TASK from its page. A screenshot of each page goes to OUT_DIR. Exit 0 when every check holds; a failed check raises.
"""
import os
import sys

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from consolelib import check, ready, session, shot  # noqa: E402

URL, OUT, OP_TOKEN, TEN_TOKEN, OWN_TASK, OTHER_TASK, NSTEPS = sys.argv[1:8]
APPROVAL_TASK = sys.argv[8] if len(sys.argv) > 8 else None
os.makedirs(OUT, exist_ok=True)


def task_ids(d):
    return [r.get_attribute("data-task-id")
            for r in d.find_elements(By.CSS_SELECTOR, "#tasks tbody tr[data-task-id]")]


def as_operator():
    with session(URL, OP_TOKEN) as d:
        d.get(URL + "#/tasks")
        ready(d, "#/tasks")
        ids = task_ids(d)
        check(OWN_TASK in ids and OTHER_TASK in ids,
              "operator: the tasks page lists the tasks (%d rows)" % len(ids))
        check(d.find_elements(By.CSS_SELECTOR, '#task-counts a[data-status="succeeded"]'),
              "operator: the counts by status are shown")
        shot(d, OUT, "tasks")
        d.find_element(By.CSS_SELECTOR, 'a.task-link[href="#/task/%s"]' % OWN_TASK).click()
        ready(d, "#/task/")
        steps = d.find_elements(By.CSS_SELECTOR, "#task-steps tr.step")
        links = [s.find_element(By.CSS_SELECTOR, "a.call-link").text for s in steps]
        check(len(steps) == int(NSTEPS) and all(x.startswith("c_") for x in links),
              "task page: %s steps, each with its call id %s" % (NSTEPS, links))
        check(d.find_elements(By.CSS_SELECTOR, "#task-timeline tbody tr"),
              "task page: the timeline of its calls")
        shot(d, OUT, "task")
        steps[0].find_element(By.CSS_SELECTOR, "a.call-link").click()
        ready(d, "#/call/")
        check(d.find_elements(By.CSS_SELECTOR, "#timeline td.event"),
              "a step's call link opens the call's page")


def as_tenant():
    with session(URL, TEN_TOKEN) as d:
        d.get(URL + "#/tasks")
        ready(d, "#/tasks")
        ids = task_ids(d)
        check(OWN_TASK in ids and OTHER_TASK not in ids,
              "tenant: its own task listed, not another tenant's (%s)" % ids)
        shot(d, OUT, "tenant-tasks")
        d.get(URL + "#/task/" + OTHER_TASK)
        ready(d, "#/task/")
        check(d.find_elements(By.ID, "not-found"),
              "tenant: another tenant's task page is not found")
        if APPROVAL_TASK:
            d.get(URL + "#/task/" + APPROVAL_TASK)
            ready(d, "#/task/")
            check(d.find_elements(By.ID, "task") and not d.find_elements(By.ID, "task-resolve"),
                  "tenant: its task awaiting approval, with no decision to make")


def approve_as_operator():
    with session(URL, OP_TOKEN) as d:
        d.get(URL + "#/task/" + APPROVAL_TASK)
        ready(d, "#/task/")
        form = d.find_element(By.ID, "task-resolve")
        opts = [o.get_attribute("value") for o in form.find_elements(By.TAG_NAME, "option")]
        check(opts == ["approve", "reject"],
              "operator: a task awaiting approval offers approve or reject (%s)" % opts)
        shot(d, OUT, "task-approval")
        Select(form.find_element(By.NAME, "as")).select_by_value("approve")
        form.find_element(By.NAME, "note").send_keys("approved in the browser test")
        form.find_element(By.CSS_SELECTOR, "button.resolve-btn").click()
        WebDriverWait(d, 20).until(EC.text_to_be_present_in_element((By.ID, "msg"), "decided"))
        check("decided %s: approve" % APPROVAL_TASK in d.find_element(By.ID, "msg").text,
              "operator: approved from the task's page")
        shot(d, OUT, "task-approved")


as_tenant()
as_operator()
if APPROVAL_TASK:
    approve_as_operator()
print("browser checks passed")
