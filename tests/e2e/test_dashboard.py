"""The web dashboard in a real browser (headless Chromium) against a live cluster running a real TensorFlow job."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

from harness import digits_spec, free_port

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
ARTIFACTS = Path(os.environ.get("TFCLUSTER_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tf extra"),
    pytest.mark.skipif(importlib.util.find_spec("selenium") is None, reason="needs selenium (the dev extra)"),
    pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                       reason="needs Debian's chromium and chromium-driver packages (.ci/run installs them)"),
]


@pytest.fixture
def browser():
    from selenium import webdriver
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000",
                     "--ignore-certificate-errors"):  # the cluster CA is not in this browser's trust store
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def wait_for(driver, predicate, timeout: float, what: str):
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, timeout, poll_frequency=0.25).until(lambda d: predicate(d), message=what)


def texts(driver, selector: str, attribute: str = "") -> list[str]:
    """The text (or an attribute) of every element the selector finds, read in one go: the page redraws itself
    every 2 s, so an element found a moment ago may be gone by the time it is read."""
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => arguments[1] ? e.getAttribute(arguments[1])"
        " : e.textContent.trim())", selector, attribute)


def test_dashboard_follows_a_real_job(make_cluster, tmp_path, browser):
    http = f"127.0.0.1:{free_port()}"
    cluster = make_cluster(3.0, "--http-listen", http)
    cluster.start_agents({"a": {"gpus": 2}, "b": {}})
    spec = digits_spec(tmp_path, "watched", epochs=6)
    # Each epoch pauses so that the evaluator, whose TensorFlow import may take longer than a whole 6-epoch run
    # on a loaded machine, sees checkpoints while training runs and not only the last one.
    spec.write_text(spec.read_text().replace('EPOCHS = "6"', 'EPOCHS = "6", EPOCH_PAUSE_SECONDS = "2"'))
    assert "EPOCH_PAUSE_SECONDS" in spec.read_text()
    job_id = cluster.cli("start", str(spec), check=True).stdout.strip()

    # The login link opens the job list; the session cookie it sets lets the browser into every other page.
    browser.get(cluster.cli("dashboard", check=True).stdout.strip())
    wait_for(browser, lambda d: job_id in texts(d, "table#jobs td a"), 30, "the job in the job list")
    assert "1 nodes ready" not in texts(browser, "#nodes-ready")
    assert texts(browser, "#nodes-ready") == ["2 nodes ready"]
    browser.get(f"https://{http}/nodes")
    wait_for(browser, lambda d: len(texts(d, "table#nodes tr[data-node]")) == 2, 30, "both nodes")
    wait_for(browser, lambda d: any(job_id in t for t in texts(d, "tr[data-node='a'] .gpu.held")), 60,
             "node a's GPU held by the job")
    cluster.cli("node", "drain", "b", "--reason", "BIOS update", check=True)  # the job runs on where it is
    wait_for(browser, lambda d: any("drained by admin" in t and "BIOS update" in t
                                    for t in texts(d, "tr[data-node='b'] .drain")), 30, "node b's drain")
    assert texts(browser, "tr[data-node='b'] .state")[0] in ("DRAINING", "DRAINED")
    assert texts(browser, "tr[data-node='a'] .state") == ["READY"]

    browser.get(f"https://{http}/jobs/{job_id}")
    wait_for(browser, lambda d: texts(d, "#job-state") == ["SUCCEEDED"], 240, "SUCCEEDED on the page, no reload")
    status = json.loads(cluster.cli("status", job_id, "--json", check=True).stdout)["jobs"][0]
    history = status["evaluation"]["history"]
    assert len(history) >= 2
    wait_for(browser, lambda d: len(texts(d, "[data-metric='accuracy'] circle")) == len(history), 10,
             "a point per evaluated checkpoint")
    steps = [int(step) for step in texts(browser, "[data-metric='accuracy'] circle", "data-step")]
    assert steps == sorted(e["step"] for e in history)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "dashboard-job.png"))

    browser.execute_script("document.querySelector(\"tr[data-task='worker:0'] a[href$='/log']\").click()")
    wait_for(browser, lambda d: "Epoch 6/6" in "".join(texts(d, "#log")), 30, "the worker's log lines")
    wait_for(browser, lambda d: texts(d, "#log-state") == ["the task has ended"], 30, "the end of the log")
    browser.save_screenshot(str(ARTIFACTS / "dashboard-log.png"))


def test_pages_need_a_login_or_a_certificate(make_cluster, browser):
    http = f"127.0.0.1:{free_port()}"
    cluster = make_cluster(3.0, "--http-listen", http)
    browser.get(f"https://{http}/")
    assert "tfcluster dashboard" in browser.page_source and "jobs" not in texts(browser, "h1")
    link = cluster.cli("dashboard", check=True).stdout.strip()
    browser.get(link)
    wait_for(browser, lambda d: texts(d, "h1") == ["Jobs"], 30, "the job list")
    browser.delete_all_cookies()
    browser.get(link)  # a link works once
    assert "unknown, used or expired" in browser.page_source
