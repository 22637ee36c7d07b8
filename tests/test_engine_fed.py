"""The engine kept fed: a window of shards (`annotate.windows_of`) samples in one engine call, enough to fill its
batch; every runner writes the same bytes for it, and a run killed (kill -9) or interrupted (Ctrl-C) with a window
partly written resumes to the uninterrupted run's rows."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.dataset as ds
import pytest

from tokencredit.pipeline.annotate import run_annotation, windows_of
from tokencredit.pipeline.config import AnnotateConfig, CreditConfig, SamplingConfig
from tokencredit.pipeline.sample import make_sampler

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vllm is not installed (the README's install command brings it)")]
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def config() -> AnnotateConfig:
    # 3 tasks x 2 prompts in shards of one prompt: 6 shards of 4 sequences, all in the engine at once
    return AnnotateConfig(limit=2, shard_size=1, backend="vllm", credit=CreditConfig(kinds=("gdpo", "mrtpo")),
                          sampling=SamplingConfig(max_new_tokens=24, seed=5))


def part_hashes(manifest: dict) -> dict:
    return {(s, table): entry[table]["sha256"] for s, entry in manifest["shards"].items()
            for table in ("responses", "credits", "nodes") if table in entry}


def rows(folder, table: str) -> list[dict]:
    return sorted(ds.dataset(folder / table).to_table().to_pylist(), key=lambda r: json.dumps(r, default=str))


def test_a_window_of_shards_is_one_engine_call_and_every_runner_writes_its_bytes(prefect_harness, tmp_path):
    from tokencredit.flows.annotate import run_annotate_flow

    assert windows_of(6, config()) == [list(range(6))]  # 6 shards of 4 sequences: one window fills the batch
    engine = make_sampler("vllm", None, device="cpu", dtype="float32", threads=AnnotateConfig.cpu_threads)
    engine.loop.peak_requests = 0
    flow = run_annotate_flow(config(), str(tmp_path / "flow"), progress=False)
    assert engine.loop.peak_requests >= 6 * 4  # one sampling call held every shard's sequences
    local = run_annotation(config(), str(tmp_path / "local"), progress=False)
    assert flow["n_shards"] == 6 and part_hashes(flow) == part_hashes(local)


def test_a_window_partly_written_is_sampled_whole_and_resumes_to_the_same_bytes(tmp_path):
    out = tmp_path / "run"
    whole = run_annotation(config(), str(out), progress=False)
    for shard in ("2", "4"):  # as if the run had stopped before writing them
        (out / "_shards" / f"shard-{int(shard):05d}.json").unlink()
        for table in ("responses", "credits", "nodes"):
            if table in whole["shards"][shard]:
                (out / whole["shards"][shard][table]["path"]).unlink()
    resumed = run_annotation(config(), str(out), progress=False)
    assert part_hashes(resumed) == part_hashes(whole)


def run_cli(out, *extra, **popen):
    args = ["annotate", "--out", str(out), "--limit", "3", "--shard-size", "1", "--max-new-tokens", "24",
            "--seed", "5", "--credit", "gdpo,mrtpo", "--backend", "vllm", "--verifier-timeout", "120", *extra]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    return subprocess.Popen([sys.executable, "-m", "tokencredit.flows.cli", *args], env=env, **popen)


def stop_after_first_shard(out, signum: int) -> int:
    """Start the run (9 shards of 4 sequences: one window, sampled in one engine call), send `signum` once its first
    shard is written (the others are being credited or waiting then); the number of shards written when it ended."""
    stop_once_a_shard_is_written(run_cli(out, start_new_session=True, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL), out, signum)
    return len(list((out / "_shards").glob("*.json")))


def stop_once_a_shard_is_written(proc: subprocess.Popen, out, signum: int) -> None:
    """Send `signum` to the command `proc` (started in a session of its own) once OUT/_shards has a marker; check
    it ended as that signal ends it, and kill what it left (its Prefect server)."""
    deadline = time.time() + 600
    while not list((out / "_shards").glob("*.json")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.kill(proc.pid, signum)  # Ctrl-C reaches the command alone; it ends what it started (pipeline.interrupts)
    assert proc.wait(timeout=120) == (-signal.SIGKILL if signum == signal.SIGKILL else 130)
    try:  # what a killed command leaves (its Prefect server)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("fed") / "whole"
    done = run_cli(out, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert done.wait(timeout=900) == 0, done.stderr.read()[-2000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGINT])
def test_a_fed_run_stopped_mid_run_resumes_to_the_uninterrupted_rows(uninterrupted, tmp_path, signum):
    out = tmp_path / "stopped"
    written = stop_after_first_shard(out, signum)
    assert 1 <= written < 9, f"the stop should land mid-run ({written} of 9 shards written)"
    resumed = run_cli(out, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert resumed.wait(timeout=900) == 0, resumed.stderr.read()[-2000:]
    for table in ("responses", "credits"):
        assert rows(out, table) == rows(uninterrupted, table)


def test_windows_follow_the_engine_batch_and_it_is_part_of_the_run_identity():
    small = AnnotateConfig(limit=2, shard_size=1, backend="vllm", engine_batch=8)
    assert windows_of(5, small) == [[0, 1], [2, 3], [4]]
    assert windows_of(3, AnnotateConfig(backend="vllm", engine_batch=1)) == [[0], [1], [2]]  # at least a shard
    assert windows_of(3, AnnotateConfig(backend="transformers")) == [[0], [1], [2]]
    assert windows_of(20, AnnotateConfig(backend="vllm")) == [list(range(8)), list(range(8, 16)), list(range(16, 20))]
    assert small.digest() != AnnotateConfig(limit=2, shard_size=1, backend="vllm").digest()
    before = {k: v for k, v in AnnotateConfig().to_dict().items() if k not in ("dtype", "engine_batch")}
    assert AnnotateConfig().digest() == hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()
    with pytest.raises(ValueError, match="--engine-batch 0"):
        AnnotateConfig(engine_batch=0)
