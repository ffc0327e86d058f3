"""issue 16: the live dashboard in headless Chromium while the main job
runs: every chart holds points, the throughput chart's points change over
time, and a screenshot is saved. Then, once the job is done, the same for
its report.html, opened from the run directory as a file (offline).

    /usr/bin/python3 tests/metrics/dashboard_test.py build/hetps OUT_DIR

Chromium and its driver are Debian's (chromium, chromium-driver); the
driver is python3-selenium's.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from running_job import RunningJob, wait_for  # noqa: E402

CHARTS = ["auc", "throughput", "busy", "batch", "window", "queue",
          "progress"]


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ["--headless=new", "--no-sandbox", "--disable-gpu",
                 "--disable-dev-shm-usage", "--window-size=1280,1400"]:
        options.add_argument(flag)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"),
                            options=options)


REPORT_CHARTS = {"auc", "throughput", "busy", "batch", "window", "queue",
                 "codec"}


def check_report(driver, job: RunningJob, out: Path) -> None:
    code = job.wait(180)
    assert code == 0, f"the job exited {code}"
    report = job.run_dir / "report.html"
    assert report.exists(), "no report.html in the run directory"
    driver.get(report.as_uri())
    points = wait_for("the report's charts", lambda: driver.execute_script(
        "const c = window.hetpsCharts || {}; const out = {};"
        "for (const k of Object.keys(c)) out[k] = c[k].points();"
        "return out;"), 10)
    print("report charts", points)
    assert set(points) == REPORT_CHARTS, points
    # Three epochs: an evaluation after each; about one status sample a
    # second for the rest.
    assert points["auc"] >= 3, points
    assert min(points[k] for k in REPORT_CHARTS - {"auc"}) >= 5, points
    auc = driver.execute_script(
        "return window.hetpsCharts.auc.data[1];")
    assert all(0.5 < a < 1 for a in auc), auc
    summary = driver.find_element("id", "summary").text
    assert "test AUC 0.7" in summary, summary
    assert "warning: window: window too small" in summary, summary
    config = driver.find_element("id", "config").text
    assert "mode: semi_async" in config and "train.epochs=3" in config, config
    shot = out / "report.png"
    driver.save_screenshot(str(shot))
    assert shot.stat().st_size > 10000, "screenshot too small"
    print("screenshot", shot)


def main() -> None:
    hetps, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for tool in ["/usr/bin/chromium", "/usr/bin/chromedriver"]:
        if not Path(tool).exists():
            raise SystemExit(f"FAIL: no {tool} (scripts/deps.sh installs it)")
    # The window pinned at 1 provokes a diagnostic (window_too_small) for
    # the warnings line of both pages.
    with RunningJob(hetps, "train.epochs=3", "window=1",
                    "semi_async.window_min=1",
                    "semi_async.adapt_window=false") as job:
        driver = browser()
        try:
            check_dashboard(driver, job, out)
            check_report(driver, job, out)
        finally:
            driver.quit()
    print("PASS")


def check_dashboard(driver, job: RunningJob, out: Path) -> None:
    driver.get(job.base + "/")

    def points():
        return driver.execute_script(
            "const c = window.hetpsCharts || {};"
            "const out = {};"
            "for (const k of Object.keys(c)) out[k] = c[k].points();"
            "return out;")

    wait_for("every chart with 3 points",
             lambda: (lambda p: set(p) == set(CHARTS) and
                      min(p.values()) >= 3)(points()), 60)

    def throughput():
        # Worker 0's samples/s column of the throughput chart.
        return driver.execute_script(
            "const c = window.hetpsCharts.throughput;"
            "return c.data[c.labels.indexOf('worker 0') + 1];")

    first = throughput()
    # Later points are there and not all the same value.
    later = wait_for(
        "new throughput points that differ from the first ones",
        lambda: (lambda t: t if len(t) > len(first) + 2 and
                 len({round(v or 0, 3) for v in t}) > 1 else None)(
            throughput()), 30)
    # Rank 0 evaluates every 2 s (main-job.yaml): the AUC chart has a
    # series with values in (0.5, 1).
    aucs = wait_for("test AUC points", lambda: driver.execute_script(
        "const c = window.hetpsCharts.auc;"
        "const i = c.labels.indexOf('test AUC');"
        "return i < 0 ? null : c.data[i + 1].filter(v => v !== null);"),
        30)
    assert all(0.5 < a < 1 for a in aucs), aucs
    print("charts", points())
    print("worker 0 samples/s", [round(v or 0) for v in later[-5:]])
    labels = driver.execute_script(
        "return window.hetpsCharts.throughput.labels;")
    assert labels == ["worker 0", "worker 1", "worker 2", "worker 3"], \
        labels
    queue = driver.execute_script(
        "return window.hetpsCharts.queue.labels;")
    assert queue == ["server 0", "server 1"], queue
    summary = driver.find_element("id", "summary").text
    assert "mode semi_async" in summary, summary
    warning = wait_for("the window diagnostic", lambda: (
        lambda t: t if "window: window too small" in t else None)(
            driver.find_element("id", "warnings").text), 30)
    print("warnings", warning)
    shot = out / "dashboard.png"
    driver.save_screenshot(str(shot))
    assert shot.stat().st_size > 10000, "screenshot too small"
    assert job.running(), "the job ended before the checks: too short"
    print("screenshot", shot)


if __name__ == "__main__":
    main()
