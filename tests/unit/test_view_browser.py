"""`agentrl-ray view` in a real headless browser: Chromium (Debian's chromium + chromium-driver) driven by Selenium.

The viewer runs as the user runs it (`python -m agentrl_ray view ROOT --port P`, a subprocess) over two run folders
written by the run's own writers (view_runs.py): a finished run and one still training. The page must show the
finished run's curves with the values of its metrics.jsonl, a known conversation in the rollout browser and the eval
transcripts, and a step written to the live run while the page is open must appear without a reload.

Without a browser this test skips and says what to install; under CI (CI=true) it fails instead: `.ci/run`
installs the browser there.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from view_runs import BROKEN, KNOWN_ANSWER, write_run

ROOT = Path(__file__).resolve().parents[2]


def browser_or_skip():
    missing = []
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install -e '.[dev]')")
    chrome = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (chrome and driver):
        missing.append("Chromium and its driver (apt-get install -y chromium chromium-driver)")
    if missing:
        message = f"the viewer's browser test needs {' and '.join(missing)}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; .ci/run installs them under CI")
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chrome
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(driver))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(what, check, timeout=20.0):
    """`check()`'s value once truthy; an element the page re-rendered while `check` read it counts as not yet."""
    from selenium.common.exceptions import StaleElementReferenceException

    end = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except StaleElementReferenceException:
            value = None
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"the page did not show {what} within {timeout:.0f} s")
        time.sleep(0.2)


@pytest.fixture
def viewer(tmp_path):
    finished = write_run(tmp_path, "finished", 4, done=True)
    live = write_run(tmp_path, "live", 2, done=False)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "agentrl_ray", "view", str(tmp_path), "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}/" in line and "2 runs" in line, line
        wait("the server", lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0)
        yield f"http://127.0.0.1:{port}/", finished, live
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture
def browser():
    driver = browser_or_skip()
    yield driver
    driver.quit()


def test_the_page_shows_a_finished_run_and_follows_a_live_one(browser, viewer):
    url, finished, live = viewer
    browser.get(url + "?run=finished")
    chart = "return window.viewState.charts.{}?.data"
    data = wait("the finished run's curves", lambda: (d := browser.execute_script(chart.format("reward"))) and d)
    records = [json.loads(x) for x in (finished.dir / "metrics.jsonl").read_text().splitlines()]
    assert data[0] == [1, 2, 3, 4]
    assert data[1] == pytest.approx([r["reward/mean"] for r in records])
    heldout = browser.execute_script(chart.format("heldout"))
    evals = [r for r in records if "eval/success" in r]
    assert heldout[0] == [r["step"] for r in evals] and heldout[1] == [r["eval/success"] for r in evals]
    assert heldout[2] == [r["eval/pass@1_ci95_lo"] for r in evals]
    assert "done" in browser.find_element("css selector", '#run-list li[data-run="finished"]').text

    browser.find_element("css selector", '#tabs button[data-tab="health"]').click()
    # Read afresh each time: the live page re-renders the health tab while it is read.
    table = wait("the integrity checks", lambda: (t := browser.find_element("id", "integrity-table").text)
                 and "token_continuity" in t and t)  # fmt: skip
    summary = "4 steps checked, 1 with a failed check"
    wait("the integrity summary", lambda: summary in browser.find_element("id", "integrity-summary").text)
    assert BROKEN in table and "3.0e-6" in table  # step 3's break; every step's probe gap
    assert browser.execute_script(chart.format("integrity"))[1] == [3e-6] * 4

    browser.find_element("css selector", '#tabs button[data-tab="rollouts"]').click()
    rollouts = browser.find_element("id", "rollouts")
    wait("a known conversation", lambda: KNOWN_ANSWER in rollouts.text)
    assert "tool call: calculator" in rollouts.text and "Error: division by zero" in rollouts.text
    # Each assistant turn shows the weights that sampled it: here new weights landed between the two turns.
    assert "assistant (weights v6)" in rollouts.text and "assistant (weights v7)" in rollouts.text
    assert "weights v6→7" in rollouts.text
    browser.find_element("css selector", '#tabs button[data-tab="evals"]').click()
    transcripts = browser.find_element("id", "transcripts")
    wait("the eval transcripts", lambda: KNOWN_ANSWER in transcripts.text)
    assert "eval_000004" in browser.find_element("id", "evals-table").text

    browser.find_element("css selector", '#tabs button[data-tab="curves"]').click()
    browser.find_element("css selector", '#run-list li[data-run="live"]').click()
    wait("the live run's two steps", lambda: browser.execute_script(chart.format("reward"))[0] == [1, 2])
    assert "training" in browser.find_element("id", "run-step").text
    live.advance()  # the learner writes step 3 while the page is open
    wait("the new step", lambda: browser.execute_script(chart.format("reward"))[0] == [1, 2, 3])
    wait("the new step's number", lambda: "step 3/12" in browser.find_element("id", "run-step").text)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
