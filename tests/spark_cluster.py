"""A Spark standalone cluster on loopback for the tests (tests/test_pipeline_cluster.py): a
master and workers started with Spark's own launcher (`$SPARK_HOME/bin/spark-class`, from the
pyspark package), and a SparkSession that runs its tasks on them.

Every daemon runs in a process group of its own (its executors are its children, in the same
group): `stop()` kills the groups, and `kill_worker_of(pid)` kills one worker and its executor
with SIGKILL, as a machine that dies would. The master and the workers take ports the system
gives (port 0: no race with the other tests' picks); the master's address is read from its log,
and its REST submission server is off.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness import wait_until
from pipeline_harness import stop_spark, stop_worker_spark

#: How long a master or a worker may take to start on a loaded 2-core machine.
DAEMON_START_S = 90
#: Each worker offers this much to the executors (one executor per worker).
WORKER_CORES, WORKER_MEMORY, EXECUTOR_MEMORY = 1, "1g", "512m"
MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
#: Killed with the test process, even by SIGKILL (an executor exits when its worker goes).
DIE_WITH_PARENT = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []


class SparkCluster:
    """A master and its workers, each a process group; logs in `directory`."""

    def __init__(self, directory: Path) -> None:
        import pyspark

        self.directory = directory
        self.spark_home = Path(pyspark.__file__).parent
        self.daemons: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}  # pid -> the daemon's log
        self.workers: list[subprocess.Popen[bytes]] = []
        self.master_url = ""

    def start_master(self) -> str:
        master = self._launch("master", "org.apache.spark.deploy.master.Master", "--port", "0")
        found = self._wait_in_log(master, MASTER_URL)
        self._wait_in_log(master, re.compile(r"New state: ALIVE"))
        self.master_url = found.group(1)
        return self.master_url

    def start_workers(self, count: int) -> list[subprocess.Popen[bytes]]:
        """`count` workers (1 core, 1 GiB each), started side by side, once all registered
        with the master."""
        started = [self._launch_worker() for _ in range(count)]
        registered = re.compile(r"Successfully registered with master")
        for worker in started:
            self._wait_in_log(worker, registered)
        return started

    def _launch_worker(self) -> subprocess.Popen[bytes]:
        name = f"worker-{len(self.workers) + 1}"
        work_dir = self.directory / name
        work_dir.mkdir()
        worker = self._launch(
            name,
            "org.apache.spark.deploy.worker.Worker",
            *("--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY),
            *("--work-dir", str(work_dir), self.master_url),
        )
        self.workers.append(worker)
        return worker

    def kill_worker_of(self, pid: int) -> int:
        """SIGKILL the worker whose descendant `pid` is (a task's Python worker), with its
        executor JVM; returns the worker's pid."""
        ancestors = _ancestors(pid)
        worker = next((w for w in self.workers if w.pid in ancestors), None)
        assert worker is not None, f"process {pid} runs under no worker of this cluster"
        os.killpg(worker.pid, signal.SIGKILL)  # the Worker JVM and its executor JVM
        worker.wait(10)
        return worker.pid

    def stop(self) -> None:
        for daemon in reversed(self.daemons):  # the workers, then the master
            if daemon.poll() is None:
                os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(10)

    def log_tails(self, lines: int = 15) -> str:
        tails = []
        for log in sorted(self.directory.glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            tails.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(tails)

    def _launch(self, name: str, main_class: str, *args: str) -> subprocess.Popen[bytes]:
        log_path = self.directory / f"{name}.log"
        with open(log_path, "wb") as log:
            daemon = subprocess.Popen(
                [*DIE_WITH_PARENT, str(self.spark_home / "bin" / "spark-class"), main_class, *args],
                env=self._environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its executors are in its group: killpg takes both
            )
        self.daemons.append(daemon)
        self.logs[daemon.pid] = log_path
        return daemon

    def _environment(self) -> dict[str, str]:
        scratch = self.directory / "scratch"
        scratch.mkdir(exist_ok=True)
        return {
            **os.environ,
            "SPARK_HOME": str(self.spark_home),
            "SPARK_CONF_DIR": str(scratch),  # none of a conf/ the machine may have
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_DIRS": str(scratch),
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_DAEMON_JAVA_OPTS": suite_jvm_options(),
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",  # no submission port
            "SPARK_MASTER_WEBUI_PORT": "0",  # any free port: no test reads the UIs
            "SPARK_WORKER_WEBUI_PORT": "0",
            "PYSPARK_PYTHON": sys.executable,  # where phpmq is installed
        }

    def _wait_in_log(self, daemon: subprocess.Popen[bytes], line: re.Pattern[str]) -> re.Match[str]:
        log = self.logs[daemon.pid]
        deadline = time.monotonic() + DAEMON_START_S
        while True:
            found = line.search(log.read_text(errors="replace"))
            if found:
                return found
            if daemon.poll() is not None or time.monotonic() > deadline:
                state = "exited" if daemon.poll() is not None else "still waiting"
                raise AssertionError(
                    f"{log.stem} ({state}): no {line.pattern!r} in its log\n{self.log_tails()}"
                )
            time.sleep(0.2)


@contextmanager
def spark_cluster(directory: Path, workers: int = 2) -> Iterator[SparkCluster]:
    """A master and `workers` workers on 127.0.0.1, all registered; killed on leaving, also
    when starting them failed halfway."""
    cluster = SparkCluster(directory)
    try:
        cluster.start_master()
        cluster.start_workers(workers)
        yield cluster
    finally:
        cluster.stop()


def cluster_session(cluster: SparkCluster, app_name: str, executors: int) -> Any:
    """A SparkSession on the cluster's master with the phpmq format registered, once
    `executors` executors (one per worker) have registered with it."""
    from pyspark.sql import SparkSession

    from phpmq.pipeline import register
    from phpmq.pipeline.session import LOCAL_CONF

    stop_worker_spark()  # else getOrCreate() would return the shared local session
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the executors' Python too
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    settings = {
        **LOCAL_CONF,
        "spark.executor.memory": EXECUTOR_MEMORY,
        "spark.executor.cores": str(WORKER_CORES),
        "spark.cores.max": str(WORKER_CORES * executors),
        "spark.default.parallelism": str(WORKER_CORES * executors),
        "spark.executor.extraJavaOptions": suite_jvm_options(),
    }
    builder = SparkSession.builder.master(cluster.master_url).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    if not wait_until(lambda: executor_count(spark) >= executors, DAEMON_START_S, 0.2):
        stop_spark(spark)
        raise AssertionError(
            f"no {executors} executors within {DAEMON_START_S} s\n{cluster.log_tails()}"
        )
    return spark


def suite_jvm_options() -> str:
    """The JVM options the suite gives its Spark drivers (SPARK_SUBMIT_OPTS, tests/conftest.py),
    for the cluster's daemons and executors too."""
    return os.environ.get("SPARK_SUBMIT_OPTS", "")


def executor_count(spark: Any) -> int:
    """The executors registered with the session's driver (the driver itself not counted)."""
    infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    return len(infos) - 1


def _ancestors(pid: int) -> set[int]:
    """`pid` and its parent, grandparent... (from /proc)."""
    found = set()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            break
        pid = int(stat.rpartition(")")[2].split()[1])  # the field after the state
    return found
