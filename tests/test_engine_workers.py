"""Many engines, one run: a local Dask cluster whose workers each own a disjoint set of cores and start their own
vllm engine there (flows/cluster.py). Two workers write the bytes one worker writes, and a worker killed with
SIGKILL mid-run costs nothing but its shard's redo."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import threading
import time

import pyarrow.dataset as ds
import pytest

from tokencredit.pipeline.config import AnnotateConfig, CreditConfig, SamplingConfig
from tokencredit.pipeline.devices import parse_cpu_list

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vllm is not installed (the README's install command brings it)"),
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two workers of one core each need 2 cores")]
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB per engine: the tiny policy needs little

TABLES = ("responses", "credits", "nodes")


def config() -> AnnotateConfig:
    """Six one-prompt shards in three windows of two (8 sequences per engine call); one thread per engine, so that
    one worker and two compute the same floats."""
    return AnnotateConfig(limit=2, shard_size=1, backend="vllm", cpu_threads=1, engine_batch=8,
                          credit=CreditConfig(kinds=("gdpo",)),
                          sampling=SamplingConfig(max_new_tokens=24, seed=7))


def rows(folder) -> dict[str, list]:
    return {table: sorted(ds.dataset(f"{folder}/{table}").to_table().to_pylist(),
                          key=lambda r: json.dumps(r, default=str)) for table in TABLES}


def workers_of(manifest: dict) -> list[dict]:
    return [entry["worker"] for entry in manifest["shards"].values()]


@pytest.fixture(scope="module")
def one_worker(prefect_harness, tmp_path_factory):
    from tokencredit.flows.annotate import run_annotate_flow

    out = tmp_path_factory.mktemp("workers") / "one"
    manifest = run_annotate_flow(config(), str(out), runner="dask", workers=1, progress=False)
    assert {w["cpus"] for w in workers_of(manifest)} == {str(min(os.sched_getaffinity(0)))}
    return out, manifest


def test_two_pinned_workers_write_the_bytes_of_one(one_worker, tmp_path):
    from tokencredit.flows.annotate import run_annotate_flow

    reference, _ = one_worker
    manifest = run_annotate_flow(config(), str(tmp_path / "two"), runner="dask", workers=2, progress=False)
    assert rows(tmp_path / "two") == rows(reference)
    # what each worker process saw from inside: its own core, one engine started for all of its shards
    by_pid = {w["pid"]: w for w in workers_of(manifest)}
    assert len(by_pid) == 2 and os.getpid() not in by_pid
    cores = [parse_cpu_list(w["cpus"]) for w in by_pid.values()]
    assert all(len(c) == 1 for c in cores) and not set(cores[0]) & set(cores[1])
    assert {w["engine_starts"] for w in by_pid.values()} == {1}


def test_a_worker_killed_mid_run_costs_only_its_redo(one_worker, tmp_path):
    """SIGKILL of the worker that wrote the first shard, while shards are still to do: the nanny starts another,
    and the run (resumed where the flow gave up) holds exactly the rows of the uninterrupted run."""
    from tokencredit.flows.annotate import run_annotate_flow

    reference, done = one_worker
    out, killed = tmp_path / "killed", {}

    def kill_first_writer() -> None:
        deadline = time.time() + 900
        while time.time() < deadline and not killed:
            markers = sorted((out / "_shards").glob("*.json")) if (out / "_shards").is_dir() else []
            if markers:
                killed["pid"] = json.loads(markers[0].read_text())["worker"]["pid"]
                killed["written"] = len(markers)
                os.kill(killed["pid"], signal.SIGKILL)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_first_writer, daemon=True)
    killer.start()
    try:
        manifest = run_annotate_flow(config(), str(out), runner="dask", workers=2, progress=False)
    except Exception:  # noqa: BLE001 - the flow may give up on the lost shard; the resume below finishes it
        manifest = None
    killer.join(timeout=900)
    assert killed, "no shard was written before the deadline"
    assert killed["written"] < done["n_shards"], "the kill should land while shards are still to do"
    manifest = manifest or run_annotate_flow(config(), str(out), runner="dask", workers=2, progress=False)
    assert manifest["complete"] and rows(out) == rows(reference)
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def test_values_on_two_pinned_workers_are_the_values_of_one(one_worker, tmp_path):
    """The derived flows take the same cluster: value curves sampled on two one-core engines are those of one."""
    from tokencredit.flows.derived import run_derived_flow
    from tokencredit.pipeline.values import VALUES_KIND, ValuesConfig

    reference, _ = one_worker
    config = ValuesConfig(k=2, cuts=2, pairs=4, shard_size=1)
    summaries = [run_derived_flow(VALUES_KIND, str(reference), str(tmp_path / f"values{n}"), config, workers=n,
                                  progress=False, backend="vllm", runner="dask") for n in (1, 2)]
    assert summaries[0]["pairs"] == summaries[1]["pairs"] > 0
    for table in ("values", "decisive"):
        got = [sorted(ds.dataset(tmp_path / f"values{n}" / table).to_table().to_pylist(),
                      key=lambda r: json.dumps(r, default=str)) for n in (1, 2)]
        assert got[0] == got[1] and got[0]
