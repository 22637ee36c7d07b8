"""The multi-machine shape on loopback: an external Dask scheduler and worker processes, one Prefect API
server for all, the run written to S3-compatible storage (moto's server); a killed run resumes and
equals an uninterrupted local run."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest

from tokencredit.flows.cli import main
from tokencredit.pipeline.dataset.query import run_query

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
BUCKET = "tokencredit-cluster"


def sorted_rows(table: str, source: str, filesystem=None) -> list[dict]:
    rows = ds.dataset(source, filesystem=filesystem, format="parquet").to_table().to_pylist()
    key = ("response_id", "reward", "constraint_index", "position") if table == "credits" else ("response_id",)
    return sorted(rows, key=lambda r: tuple(-1 if r[k] is None else r[k] for k in key))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, what: str, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not check():
        assert time.time() < deadline, f"{what} did not come up within {timeout:.0f} s"
        time.sleep(0.5)


def healthy(url: str) -> bool:
    try:
        return urllib.request.urlopen(url, timeout=5).status == 200
    except OSError:
        return False


class Processes:
    """Child processes started by the test, each stopped by its own pid at the end."""

    def __init__(self, logs: Path):
        self.logs, self.children = logs, []

    def start(self, name: str, args: list[str], env: dict) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "w")
        child = subprocess.Popen([sys.executable, *args], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        self.children.append((child, log))
        return child

    def stop(self) -> None:
        for child, log in reversed(self.children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(30)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
            log.close()


@pytest.fixture()
def cluster(tmp_path, monkeypatch):
    """(environment for processes that use the cluster, scheduler address, logs folder)."""
    s3, api, scheduler = free_port(), free_port(), free_port()
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    # a busy test machine can stall a process for half a minute: Dask's 30 s connection timeouts
    # would then cancel the run ("scheduler-connection-lost")
    env.update(DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT="300s", DASK_DISTRIBUTED__COMM__TIMEOUTS__TCP="300s")
    env.update(PYTHONPATH=str(ROOT), DO_NOT_TRACK="1", AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
               AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=f"http://127.0.0.1:{s3}",
               PREFECT_API_URL=f"http://127.0.0.1:{api}/api")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL"):
        monkeypatch.setenv(key, env[key])  # this process reads the bucket too
    processes = Processes(logs)
    try:
        processes.start("s3", ["-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3)], env)
        server_env = {**env, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_UI_ENABLED": "false",
                      "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        server_env.pop("PREFECT_API_URL")
        processes.start("prefect-server", ["-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                                           str(api)], server_env)
        processes.start("dask-scheduler", ["-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
                                           str(scheduler), "--no-dashboard"], env)
        for i in range(2):
            processes.start(f"dask-worker-{i}", ["-m", "distributed.cli.dask_worker", f"tcp://127.0.0.1:{scheduler}",
                                                 "--nthreads", "1", "--no-dashboard", "--name", f"worker-{i}"], env)
        wait_for(lambda: healthy(f"http://127.0.0.1:{s3}/moto-api/"), "moto's S3 server")
        wait_for(lambda: healthy(f"http://127.0.0.1:{api}/api/health"), "the Prefect server", timeout=600)
        from distributed import Client

        with Client(f"tcp://127.0.0.1:{scheduler}", timeout=120) as client:
            client.wait_for_workers(2, timeout=300)
        pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{s3}", scheme="http", allow_bucket_creation=True
                          ).create_dir(BUCKET)
        yield env, f"tcp://127.0.0.1:{scheduler}", logs
    finally:
        processes.stop()


def test_killed_run_on_dask_workers_to_s3_resumes_equal_to_a_local_run(cluster, tmp_path):
    env, scheduler, logs = cluster
    out = f"s3://{BUCKET}/runs/killed"
    options = ["--limit", "3", "--shard-size", "1", "--n", "3", "--max-new-tokens", "40", "--seed", "7",
               "--run-id", "cluster-test"]
    command = [sys.executable, "-m", "tokencredit.flows.cli", "annotate", "--out", out, *options, "--runner", "dask",
               "--dask-address", scheduler]
    fs, root = pafs.FileSystem.from_uri(out)

    def written() -> int:
        infos = fs.get_file_info(pafs.FileSelector(f"{root}/_shards", allow_not_found=True))
        return sum(i.base_name.startswith("shard-") for i in infos)

    with open(logs / "driver-killed.log", "w") as log:
        driver = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: written() >= 2 or driver.poll() is not None, "two shards on S3", timeout=900)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    assert 2 <= written() < 9, f"the kill should land mid-run ({written()} of 9 shards written)"
    assert fs.get_file_info(f"{root}/.lock").type == pafs.FileType.File  # left by the killed driver

    resumed = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert fs.get_file_info(f"{root}/.lock").type == pafs.FileType.NotFound

    local = tmp_path / "uninterrupted"
    assert main(["annotate", "--out", str(local), *options, "--runner", "none"]) == 0
    for table in ("responses", "credits"):
        assert sorted_rows(table, f"{root}/{table}", fs) == sorted_rows(table, str(local / table)), table
    assert run_query(out, "SELECT count(DISTINCT response_id) FROM responses").fetchall() == [(27,)]

    # one Prefect API for all: the driver's flow runs and the workers' task runs are on the server,
    # and no process started a temporary server of its own
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
        with get_client(sync_client=True) as client:
            flow_runs = client.read_flow_runs()
            task_runs = [r for r in client.read_task_runs() if r.name.startswith("annotate-window")]
    assert len(flow_runs) == 2 and sorted(r.state_name for r in flow_runs)[0] == "Completed"
    assert len({r.name for r in task_runs}) >= 9
    for log in logs.glob("*.log"):
        assert "Starting temporary server" not in log.read_text(), log.name
