"""Screenshots of every view of `agentrl-ray view`, taken by headless Chromium (Debian's chromium +
chromium-driver, driven by Selenium), for docs/viewer.md and the README.

    python tools/view_screenshots.py RUNS_DIR --run NAME [--eval-run NAME] [--compare NAME ...] [--out DIR]

RUNS_DIR is served as `agentrl-ray view RUNS_DIR` serves it; NAME is the run shown in the runs, curves and health
views, `--eval-run` the one whose rollouts and `agentrl-ray eval` report are shown; the compare view shows the runs
named by `--compare` (every run without it), coloured by `--compare-key` (default echo.coeff).
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABS = ("runs", "curves", "health", "rollouts", "evals", "compare")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs")
    p.add_argument("--run", required=True)
    p.add_argument("--eval-run")
    p.add_argument("--compare", nargs="*", default=[], help="the runs ticked for the compare view")
    p.add_argument("--compare-key", default="echo.coeff")
    p.add_argument("--compare-metric", default="reward/mean")
    p.add_argument("--out", default=str(ROOT / "docs" / "viewer"))
    args = p.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import Select

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    viewer = subprocess.Popen([sys.executable, "-m", "agentrl_ray", "view", args.runs, "--port", str(port)], cwd=ROOT)
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1500,1150"):
        options.add_argument(arg)
    browser = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        time.sleep(3)
        for tab in TABS:
            run = args.eval_run if tab in ("rollouts", "evals") and args.eval_run else args.run
            browser.get(f"http://127.0.0.1:{port}/?run={run}&tab={tab}")
            time.sleep(3)
            if tab == "compare":
                for name in args.compare:
                    browser.find_element("css selector", f'#run-list li[data-run="{name}"] input').click()
                browser.find_element("id", "cmp-key").clear()
                browser.find_element("id", "cmp-key").send_keys(args.compare_key)
                Select(browser.find_element("id", "cmp-metric")).select_by_value(args.compare_metric)
                time.sleep(2)
            browser.save_screenshot(str(out / f"{tab}.png"))
            print(out / f"{tab}.png")
    finally:
        browser.quit()
        viewer.terminate()


if __name__ == "__main__":
    main()
