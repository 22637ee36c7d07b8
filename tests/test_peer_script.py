"""bench/peer_script.py, the plain script annotate is benchmarked against, samples what `tokencredit annotate
--backend vllm` samples: the same response token ids for the same prompts, options and seed."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokencredit.pipeline.dataset.query import connect

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vllm is not installed (the README's install command brings it)")]
ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "bench" / "closed_loop_prompts" / "prompts.jsonl"


def test_the_peer_script_samples_the_response_tokens_annotate_samples(tmp_path):
    options = ["--prompts", str(PROMPTS), "--split", "train", "--limit", "3", "--n", "2", "--max-new-tokens", "16",
               "--seed", "5"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    peer = subprocess.run([sys.executable, str(ROOT / "bench" / "peer_script.py"), *options, "--model", "",
                           "--tokens", str(tmp_path / "peer.json")], capture_output=True, text=True, env=env,
                          timeout=900)
    assert peer.returncode == 0, peer.stderr[-3000:]
    report = json.loads(peer.stdout.strip().splitlines()[-1])
    assert set(report["phases"]) == {"imports", "engine_start", "generate", "verify"}
    assert report["responses"] == 6 and report["tokens"] > 0
    annotate = subprocess.run([sys.executable, "-m", "tokencredit.flows.cli", "annotate", "--out", str(tmp_path / "run"),
                               *options, "--backend", "vllm", "--credit", "gdpo", "--runner", "none"],
                              capture_output=True, text=True, env=env, timeout=900)
    assert annotate.returncode == 0, annotate.stderr[-3000:]
    rows = connect(str(tmp_path / "run")).execute("SELECT response_id, token_ids FROM responses").fetchall()
    ours = json.loads((tmp_path / "peer.json").read_text())
    assert {response_id: list(ids) for response_id, ids in rows} == ours
    assert len({tuple(ids) for ids in ours.values()}) > 1  # sampled, not one greedy answer six times
