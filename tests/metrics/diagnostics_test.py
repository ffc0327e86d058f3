"""The diagnostics of SPEC §6 (src/coord/diagnostics.h), each provoked in a
real job and read back from the job's status; and a clean run that raises
none. One scenario per run:

    diagnostics_test.py HETPS SCENARIO

clean           the main job with steady workers: no warning at all
window_small    semi_async window pinned at 1: window_too_small
window_large    window pinned at 500 with a straggler (batches fixed, so
                its steps outlast the time bound): window_too_large
slow_worker     worker 3 at 30% of its profile for the whole run
skewed_shard    worker 3 reads a copy of the data where every rating is 5
                (one label): skewed_shard for worker 3 only
saturated       one server for ten workers, the server in a cgroup with a
                tenth of a CPU: server_saturated (skipped, exit 77, where no
                writable cgroup CPU controller exists)

Jobs are the main job (examples/main-job.yaml) on loopback, started by
`hetps launch` or, where a role needs its own data or cgroup, role by role;
every process is stopped on exit.
"""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from running_job import ROOT, free_port, wait_for  # noqa: E402

MAIN_JOB = str(ROOT / "examples/main-job.yaml")
STEADY = ("device_profiles=[{ranks: [0, 1], throughput: 6000}, "
          "{ranks: [2, 3], throughput: 2000}]")


def fail(message: str):
    raise SystemExit("FAIL: " + message)


def launch(hetps: str, work: Path, *overrides: str) -> list:
    """Runs the main job with `overrides`; returns its summary's diagnostics."""
    run_dir = work / "run"
    args = [hetps, "launch", MAIN_JOB, "--run-dir", str(run_dir)]
    for o in overrides:
        args += ["--set", o]
    out = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=240, start_new_session=True)
    print(out.stdout[-3000:])
    if out.returncode != 0:
        fail(f"hetps launch exited {out.returncode}")
    return json.loads((run_dir / "summary.json").read_text())["diagnostics"]


class Roles:
    """A job started role by role on loopback: extra arguments and a command
    prefix per role; stopped (the whole process group) on exit."""

    def __init__(self, hetps: str, work: Path, servers: int, workers: int,
                 *overrides: str):
        self.hetps, self.work = hetps, work
        self.port = free_port()
        self.args = ["--config", MAIN_JOB,
                     "--set", f"cluster.servers={servers}",
                     "--set", f"cluster.workers={workers}",
                     "--set", "cluster.ps_endpoints=" + ",".join(
                         f"127.0.0.1:{free_port() if s else self.port}"
                         for s in range(servers))]
        for o in overrides:
            self.args += ["--set", o]
        self.servers, self.workers = [], []

    def _start(self, role: str, rank: int, extra, prefix):
        log = open(self.work / f"{role}{rank}.log", "w")
        return subprocess.Popen(
            list(prefix) + [self.hetps, role] + self.args + list(extra) +
            ["--rank", str(rank)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def server(self, rank: int, extra=(), prefix=()):
        self.servers.append(self._start("server", rank, extra, prefix))
        wait_for(f"server {rank} to listen",
                 lambda: "HETPS_LISTENING" in
                 (self.work / f"server{rank}.log").read_text(), 30)

    def worker(self, rank: int, extra=()):
        self.workers.append(self._start("worker", rank, extra, ()))

    def finish(self, timeout_s: float) -> dict:
        """Waits for every worker to exit 0; returns the job's status."""
        deadline = time.monotonic() + timeout_s
        for w, p in enumerate(self.workers):
            try:
                rc = p.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                fail(f"worker {w} still running after {timeout_s:.0f} s")
            if rc != 0:
                fail(f"worker {w} exited {rc}; see {self.work}/worker{w}.log")
        status = subprocess.run(
            [self.hetps, "status", "--coordinator", f"127.0.0.1:{self.port}",
             "--json"], stdout=subprocess.PIPE, text=True, timeout=30)
        if status.returncode != 0:
            fail("hetps status failed")
        return json.loads(status.stdout)

    def stop(self):
        for p in self.servers + self.workers:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.servers + self.workers:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()  # gone from its cgroup before the cgroup goes


def expect(diagnostics: list, kind: str, subject: str):
    """Exactly the warnings of `kind` named, and each about `subject`."""
    print(json.dumps(diagnostics, indent=1))
    found = [d for d in diagnostics if d["kind"] == kind]
    if not found:
        fail(f"no {kind} warning among {diagnostics}")
    if [d["subject"] for d in found] != [subject]:
        fail(f"{kind} expected for {subject} only, got {found}")
    if not found[0]["message"]:
        fail(f"{kind} without the numbers behind it")
    return found[0]


def cpu_cgroup(name: str):
    """A new cgroup with the CPU controller (v2, else v1): its directory and
    the quota file's name, or None where none can be made here."""
    v2 = Path("/sys/fs/cgroup")
    if (v2 / "cgroup.controllers").exists() and \
            "cpu" in (v2 / "cgroup.subtree_control").read_text().split():
        candidates = [(v2 / name, "cpu.max")]
    else:
        candidates = [(Path("/sys/fs/cgroup/cpu") / name, "cpu.cfs_quota_us"),
                      (Path("/sys/fs/cgroup/cpu,cpuacct") / name,
                       "cpu.cfs_quota_us")]
    for directory, quota in candidates:
        try:
            directory.mkdir()
        except OSError:
            continue
        try:
            # A tenth of a CPU.
            text = "10000 100000" if quota == "cpu.max" else "10000"
            (directory / quota).write_text(text)
            return directory
        except OSError:
            directory.rmdir()
    return None


def remove_cgroup(directory: Path):
    """Removes a cgroup once the kernel has let its last task go: a reaped
    process can keep it busy (EBUSY) for a while after wait() returns."""
    def removed():
        for pid in (directory / "cgroup.procs").read_text().split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            directory.rmdir()
            return True
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            return False
    wait_for(f"{directory} to empty", removed, 30)


def main():
    hetps, scenario = sys.argv[1], sys.argv[2]
    work = Path(tempfile.mkdtemp(prefix=f"hetps-diag-{scenario}-"))
    roles = None
    cgroup = None
    try:
        if scenario == "clean":
            diagnostics = launch(hetps, work, STEADY)
            print(json.dumps(diagnostics, indent=1))
            if diagnostics:
                fail(f"a clean run raised {diagnostics}")
        elif scenario == "window_small":
            expect(launch(hetps, work, STEADY, "window=1",
                          "semi_async.window_min=1",
                          "semi_async.adapt_window=false"),
                   "window_too_small", "window")
        elif scenario == "window_large":
            # Worker 3 at 20 samples/s for its first 8 s: a fixed batch of
            # 64 takes it 3 s, longer than the time bound (0.5 s), so the
            # queue the others fill is applied by time, never by the window.
            expect(launch(hetps, work, "window=500",
                          "semi_async.window_max=500",
                          "semi_async.adapt_window=false",
                          "planner.batch_plan=fixed", "train.epochs=1",
                          "train.data.chunks=400",
                          "device_profiles=[{ranks: [0, 1, 2], throughput: "
                          "6000}, {ranks: [3], throughput: 2000, slowdowns: "
                          "[{from_s: 0, to_s: 8, factor: 0.01}]}]"),
                   "window_too_large", "window")
        elif scenario == "slow_worker":
            expect(launch(hetps, work,
                          "device_profiles=[{ranks: [0, 1], throughput: "
                          "6000}, {ranks: [2], throughput: 2000}, {ranks: "
                          "[3], throughput: 2000, slowdowns: [{from_s: 0, "
                          "to_s: 1000, factor: 0.3}]}]"),
                   "slow_worker", "worker 3")
        elif scenario == "skewed_shard":
            data = work / "one-label"
            shutil.copytree(ROOT / "data/movielens-small", data)
            lines = (data / "ratings.csv").read_text().splitlines()
            rows = [lines[0]] + [",".join(f[:2] + ["5.0"] + f[3:])
                                 for f in (x.split(",") for x in lines[1:])]
            (data / "ratings.csv").write_text("\n".join(rows) + "\n")
            roles = Roles(hetps, work, 1, 4, STEADY, "train.epochs=1")
            roles.server(0)
            for w in range(4):
                roles.worker(w, ["--set", f"train.data.path={data}"]
                             if w == 3 else [])
            status = roles.finish(180)
            skew = expect(status["diagnostics"], "skewed_shard", "worker 3")
            if "label rate 1.000" not in skew["message"]:
                fail("the warning does not give worker 3's label rate")
        elif scenario == "saturated":
            cgroup = cpu_cgroup(f"hetps-diag-{os.getpid()}")
            if cgroup is None:
                print("SKIP: no writable cgroup CPU controller here")
                sys.exit(77)
            roles = Roles(hetps, work, 1, 10, "device_profiles=[]",
                          "train.epochs=3")
            roles.server(0, prefix=[
                "/bin/sh", "-c",
                f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh"])
            for w in range(10):
                roles.worker(w)
            expect(roles.finish(240)["diagnostics"], "server_saturated",
                   "server 0")
        else:
            fail(f"unknown scenario {scenario}")
    finally:
        if roles:
            roles.stop()
        if cgroup:
            remove_cgroup(cgroup)
        if not os.environ.get("HETPS_KEEP"):
            shutil.rmtree(work, ignore_errors=True)
    print("PASS")


if __name__ == "__main__":
    main()
