"""The engine kept fed by `repair`: a window of shards (`RepairJob.windows`) is resampled in one engine call, enough
to fill its batch; every runner writes the same bytes for it, and a repair killed (kill -9) or interrupted (Ctrl-C)
with a window partly written resumes to the uninterrupted run's pairs."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from tokencredit.pipeline.annotate import AnnotateConfig, run_annotation
from tokencredit.pipeline.config import SamplingConfig
from tokencredit.pipeline.dataset.derived import run_derived
from tokencredit.pipeline.repair import PAIRS, REPAIR, RepairConfig, prepare_repair

from tests.test_engine_fed import stop_once_a_shard_is_written

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vllm is not installed (the README's install command brings it)")]
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

# 8 failures in shards of 2, resampled twice: 4 shards of 4 rows, one window of 16 on the CPU engine (batch 256)
CONFIG = RepairConfig(n=2, shard_size=2, seed=3, limit=8)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fed-repair") / "run"
    run_annotation(AnnotateConfig(limit=3, tasks=("instructions", "tools"),
                                  sampling=SamplingConfig(n=4, max_new_tokens=24, seed=2)), str(out), progress=False)
    return out


def markers(out) -> dict[int, dict]:
    """Each shard's marker: its rows, the sha256 of its part file and its counts (tokens resampled included)."""
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in (out / "_shards").glob("shard-*.json")}


def test_a_window_of_shards_is_one_engine_call_and_every_runner_writes_its_bytes(prefect_harness, run, tmp_path):
    from tokencredit.flows.derived import run_derived_flow
    from tokencredit.pipeline.sample import load_sampler

    engine, _ = load_sampler("vllm", None, "cpu")
    engine.loop.peak_requests = 0
    local = run_derived(REPAIR, str(run), str(tmp_path / "local"), CONFIG, progress=False, backend="vllm")
    assert engine.loop.peak_requests == 8 * CONFIG.n  # every shard's resamples in the engine at once
    flow = run_derived_flow(REPAIR, str(run), str(tmp_path / "flow"), CONFIG, progress=False, backend="vllm")
    assert local["shards"] == 4 and local["pairs_written"] == flow["pairs_written"] > 0
    assert markers(tmp_path / "local") == markers(tmp_path / "flow")
    job = prepare_repair(str(run), str(tmp_path / "local"), CONFIG)
    assert job.windows("vllm", "cpu") == [[0, 1, 2, 3]]
    assert job.windows("transformers", "cpu") == [[0], [1], [2], [3]]  # its batches are its own (batch_size)


def test_the_window_draws_the_resamples_a_shard_at_a_time_drew(run, tmp_path):
    """The same tokens as before the window (each shard's rows in batches of `batch_size`, one call each): the
    draws are the rows' own seeds, and the batch a row shares moves no draw here."""
    from tokencredit.pipeline.repair import resample
    from tokencredit.pipeline.sample import load_sampler

    engine, _ = load_sampler("vllm", None, "cpu")
    job = prepare_repair(str(run), str(tmp_path / "pairs"), CONFIG)
    window = [t for shard in job.shards for t in shard]
    before = [row for shard in job.shards for row in resample(engine, shard, [t.cut for t in shard], job.sampling,
                                                             CONFIG.n, CONFIG.seed, CONFIG.batch_size)]
    assert resample(engine, window, [t.cut for t in window], job.sampling, CONFIG.n, CONFIG.seed, None) == before


@pytest.mark.slow
def test_a_dask_worker_resamples_the_window_to_the_in_process_bytes(prefect_harness, run, tmp_path):
    from tokencredit.flows.derived import run_derived_flow

    run_derived(REPAIR, str(run), str(tmp_path / "local"), CONFIG, progress=False, backend="vllm")
    run_derived_flow(REPAIR, str(run), str(tmp_path / "dask"), CONFIG, progress=False, backend="vllm", runner="dask")
    assert markers(tmp_path / "local") == markers(tmp_path / "dask")


def test_windows_fill_the_engine_batch():
    from tokencredit.pipeline.repair import RepairJob

    job = RepairJob("run", "out", RepairConfig(), [[None] * 16] * 10, SamplingConfig(), None, 5.0, 1)
    assert job.windows("vllm", "cpu") == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # 16 x 4 rows: 4 shards fill 256
    assert job.windows("vllm", "cuda") == [list(range(10))]


def test_a_window_partly_written_is_resampled_whole_and_resumes_to_the_same_bytes(run, tmp_path):
    out = tmp_path / "pairs"
    run_derived(REPAIR, str(run), str(out), CONFIG, progress=False, backend="vllm")
    whole = markers(out)
    kept = os.stat(out / "_shards/shard-00000.json").st_mtime_ns
    for shard in (1, 3):  # as if the run had stopped before writing them
        (out / f"_shards/shard-{shard:05d}.json").unlink()
        (out / f"pairs/part-{shard:05d}.parquet").unlink(missing_ok=True)
    run_derived(REPAIR, str(run), str(out), CONFIG, progress=False, backend="vllm")
    assert markers(out) == whole
    assert os.stat(out / "_shards/shard-00000.json").st_mtime_ns == kept  # a written shard is not written again


def repair_cli(run, out, **popen):
    # 64 resamples of each failure, one failure a shard: 8 shards of 64 rows, in 2 windows of 4 (the CPU engine's 256)
    args = ["repair", str(run), "--out", str(out), "--n", "64", "--shard-size", "1", "--limit", "8", "--seed", "3",
            "--backend", "vllm"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    return subprocess.Popen([sys.executable, "-m", "tokencredit.flows.cli", *args], env=env, **popen)


def pairs(out) -> list[dict]:
    return sorted(pq.read_table(out / "pairs", schema=PAIRS).to_pylist(), key=lambda r: r["pair_id"])


@pytest.fixture(scope="module")
def uninterrupted(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("fed-repair") / "whole"
    done = repair_cli(run, out, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert done.wait(timeout=900) == 0, done.stderr.read()[-2000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGINT])
def test_a_fed_repair_stopped_mid_run_resumes_to_the_uninterrupted_pairs(run, uninterrupted, tmp_path, signum):
    """`signum` lands once the first shard is written (the rest of its window being verified, or the next window
    sampled); the resumed run resamples a window partly written whole and writes the rest."""
    out = tmp_path / "stopped"
    stop_once_a_shard_is_written(repair_cli(run, out, start_new_session=True, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL), out, signum)
    written = len(markers(out))
    assert 1 <= written < 8, f"the stop should land mid-run ({written} of 8 shards written)"
    resumed = repair_cli(run, out, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert resumed.wait(timeout=900) == 0, resumed.stderr.read()[-2000:]
    assert markers(out) == markers(uninterrupted)
    rows = pairs(out)
    assert rows == pairs(uninterrupted) and len({r["pair_id"] for r in rows}) == len(rows)
