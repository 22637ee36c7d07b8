"""`python -m bench peer --quick`: the peer benchmark's harness runs every arm once, end to end, and reports every key
the issue lists, so that the harness cannot rot between the benchmark's full runs."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tokencredit.pipeline.models.registry import is_pulled

MODEL = "smollm2-135m-instruct"
pytestmark = [pytest.mark.vllm, pytest.mark.real, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vllm is not installed (the README's install command brings it)"),
              pytest.mark.skipif(not is_pulled(MODEL), reason=f"run `tokencredit models pull {MODEL}` first")]
ROOT = Path(__file__).resolve().parent.parent
KEYS = ("annotate_gdpo_over_peer", "mrtpo_over_gdpo", "startup_over_peer", "replay_tokens_over_min",
        "replay_flops_over_gemm_peak", "decode_flops_over_gemm_peak", "decode_flops_over_gemm_peak_peer",
        "tree_over_flat", "repeats", "load_avg", "commit")


def test_the_quick_benchmark_runs_every_arm_and_reports_every_key(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bench", "peer", "--quick", "--results-dir", str(tmp_path / "results"),
                           "--", "--work", str(tmp_path / "work")], capture_output=True, text=True, timeout=3000,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads((tmp_path / "results" / "peer.json").read_text())
    row = json.loads((tmp_path / "results" / "runs.jsonl").read_text())
    assert row["benchmark"] == "peer" and row["figures"] == out
    assert all(key in out for key in KEYS), sorted(set(KEYS) - set(out))
    assert out["repeats"] == 1 and out["mode"] == "quick" and len(out["commit"]) == 40
    assert {arm: len(rows) for arm, rows in out["runs"].items()} == {"peer": 1, "gdpo": 1, "mrtpo": 1, "tree": 1}
    for rows in out["runs"].values():
        before, after = rows[0]["load_avg"]
        assert rows[0]["wall_s"] > 0 and before >= 0 and after >= 0
    assert out["load_avg"]["min"] <= out["load_avg"]["max"]
    # what the runs measured: every wall-time key is a number; the replay's counters are null until the manifest
    # records them (replay_positions_computed, replay_positions_min, replay_s)
    for key in ("annotate_gdpo_over_peer", "mrtpo_over_gdpo", "startup_over_peer", "decode_flops_over_gemm_peak",
                "decode_flops_over_gemm_peak_peer", "tree_over_flat"):
        assert out[key] > 0, key
    mrtpo = out["runs"]["mrtpo"][0]
    needs = {"replay_tokens_over_min": ("replay_positions_computed", "replay_positions_min"),
             "replay_flops_over_gemm_peak": ("replay_positions_min", "replay_s")}
    for key, counters in needs.items():
        assert (out[key] is None) == any(mrtpo[c] is None for c in counters), key
    names = [row[0] for row in out["targets"]]
    assert names == ["annotate_gdpo_over_peer", "mrtpo_over_gdpo", "startup_over_peer", "replay_tokens_over_min",
                     "replay_flops_over_gemm_peak", "decode_flops_over_gemm_peak", "tree_over_flat"]
    for name, comparison, value, met in out["targets"]:
        assert comparison.split()[0] in ("<=", ">=") and value == out[name]
        assert met is None if value is None else isinstance(met, bool)
    assert set(out["notes"]) == {name for name, _, _, met in out["targets"] if met is False}
    assert out["where"]["gdpo"]["sample"] > 0 and out["where"]["peer"]["generate"] > 0
    assert out["runs"]["tree"][0]["responses"] == out["runs"]["gdpo"][0]["responses"] == 4 * 2
