"""The closed-loop experiment (bench/closed_loop.py): its prompt set, its statistics and its quick mode."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import closed_loop  # noqa: E402

from tokencredit import verifiers  # noqa: E402

_spec = importlib.util.spec_from_file_location("closed_loop_prompts",
                                               ROOT / "bench" / "closed_loop_prompts" / "build.py")
prompt_set = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prompt_set)


def test_the_prompt_set_is_the_builders_and_keeps_unseen_kinds_out_of_training():
    built = prompt_set.build("final")
    stored = [json.loads(line) for line in (ROOT / "bench" / "closed_loop_prompts" / "prompts.jsonl").open()]
    assert built == stored  # deterministic, and the committed file is what the builder writes
    records, rejected = verifiers.load_tasks(ROOT / "bench" / "closed_loop_prompts" / "prompts.jsonl")
    assert not rejected and len(records) == 512
    train = [r for r in records if r.split == "train"]
    held_out = [r for r in records if r.split == "test"]
    assert len(train) == 256 and len(held_out) == 256
    train_kinds = {c.kind for r in train for c in r.spec.constraints}
    unseen = [r for r in held_out if r.id.startswith("unseen-")]
    assert len(unseen) == 64 and train_kinds == set(prompt_set.SEEN)
    assert all({c.kind for c in r.spec.constraints} <= set(prompt_set.UNSEEN) for r in unseen)
    assert all(2 <= len(r.spec.constraints) <= 4 for r in train + held_out if not r.id.startswith("unseen-"))
    assert not {r.prompt for r in train} & {r.prompt for r in held_out}


def test_paired_difference_interval_and_detectable_effect_match_scipy():
    rng = np.random.default_rng(1)
    ids = [f"p{i}" for i in range(200)]
    a = {i: float(x) for i, x in zip(ids, rng.uniform(0, 1, 200))}
    b = {i: a[i] - float(d) for i, d in zip(ids, rng.normal(0.05, 0.2, 200))}
    out = closed_loop.paired(a, b, ids, draws=20_000)
    diff = np.array([a[i] - b[i] for i in ids])
    assert out["diff"] == pytest.approx(diff.mean())
    reference = stats.bootstrap((diff,), np.mean, method="percentile", n_resamples=20_000, random_state=0)
    assert out["ci_low"] == pytest.approx(reference.confidence_interval.low, abs=0.004)
    assert out["ci_high"] == pytest.approx(reference.confidence_interval.high, abs=0.004)
    assert out["mde"] == pytest.approx(2.8 * diff.std(ddof=1) / np.sqrt(200))
    same = closed_loop.paired(a, a, ids)
    assert same["diff"] == same["ci_low"] == same["ci_high"] == same["mde"] == 0


@pytest.mark.slow
def test_quick_mode_runs_both_arms_and_keeps_nothing(tmp_path):
    before = sorted(p.name for p in (ROOT / "bench" / "results").iterdir())
    done = subprocess.run([sys.executable, "bench/closed_loop.py", "quick"], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "quick run: 23 rows" in done.stdout and "dev variants" in done.stdout
    assert "('iterated', 'mrtpo')" in done.stdout and "('offline', 'rs')" in done.stdout
    assert sorted(p.name for p in (ROOT / "bench" / "results").iterdir()) == before
