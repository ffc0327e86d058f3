"""issue 16: Debian's Prometheus scrapes a running main job and its HTTP API
gives back the window, each worker's throughput and each server's queue
length with the right labels.

The job: examples/main-job.yaml (semi_async, 2 servers, 4 workers), three
epochs so that it runs long enough for several scrapes. Prometheus finds
the servers through the coordinator's /api/targets (http_sd_configs) and
scrapes every second.

    /usr/bin/python3 tests/metrics/prometheus_test.py build/hetps
"""

import json
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from running_job import RunningJob, free_port, get, wait_for  # noqa: E402

WORKERS = {"0", "1", "2", "3"}
SERVERS = {"0", "1"}


def main() -> None:
    hetps = sys.argv[1]
    if shutil.which("prometheus") is None:
        raise SystemExit("FAIL: no prometheus (scripts/deps.sh installs it)")
    with RunningJob(hetps, "train.epochs=3") as job:
        prometheus = None
        try:
            config = job.dir / "prometheus.yml"
            config.write_text(f"""
    global:
      scrape_interval: 1s
      scrape_timeout: 1s
    scrape_configs:
      - job_name: hetps
        http_sd_configs:
          - url: {job.base}/api/targets
            refresh_interval: 1s
    """)
            port = free_port()
            prometheus = subprocess.Popen(
                ["prometheus", f"--config.file={config}",
                 f"--storage.tsdb.path={job.dir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}"],
                stdout=open(job.dir / "prometheus.log", "w"),
                stderr=subprocess.STDOUT)
            api = f"http://127.0.0.1:{port}/api/v1"

            def query(expr: str):
                try:
                    reply = json.loads(get(
                        f"{api}/query?query={urllib.parse.quote(expr)}"))
                except OSError:
                    return []  # not listening yet
                if reply["status"] != "success":
                    return []
                return reply["data"]["result"]

            def labels(expr: str, label: str):
                return {r["metric"].get(label) for r in query(expr)}

            # The targets Prometheus discovered: both servers, up.
            wait_for("both servers as Prometheus targets, up",
                     lambda: labels("up == 1", "hetps_server") == SERVERS, 60)
            window = wait_for("hetps_window",
                              lambda: query("hetps_window"), 30)
            print("window", window[0]["value"][1])
            assert int(window[0]["value"][1]) >= 1, window
            # Each worker's throughput, labelled by rank, positive once it
            # trains.
            rates = wait_for(
                "hetps_worker_samples_per_second > 0 for all four workers",
                lambda: (lambda r: r if {x["metric"]["worker"] for x in r}
                         == WORKERS else None)(
                    query("hetps_worker_samples_per_second > 0")), 60)
            for r in sorted(rates, key=lambda r: r["metric"]["worker"]):
                print("worker", r["metric"]["worker"], "samples/s",
                      round(float(r["value"][1])))
            # Each server's queue length, labelled by rank; job-level series
            # come from server 0 alone.
            queues = wait_for(
                "hetps_server_queue_length of both servers",
                lambda: (lambda r: r if {x["metric"]["server"] for x in r}
                         == SERVERS else None)(
                    query("hetps_server_queue_length")),
                30)
            print("queue lengths", {q["metric"]["server"]: q["value"][1]
                                    for q in queues})
            sources = labels("hetps_window", "hetps_server")
            assert sources == {"0"}, f"hetps_window scraped from {sources}"
            # A latency histogram made it too, with its buckets.
            assert query("hetps_server_pull_latency_seconds_bucket"
                         "{le=\"+Inf\"} > 0"), "no pull latency histogram"
            assert job.running(), "the job ended before the checks: too short"
            print("PASS")
        finally:
            if prometheus is not None:
                prometheus.terminate()
                prometheus.wait(timeout=15)


if __name__ == "__main__":
    main()
