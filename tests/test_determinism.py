"""The same config writes the same bytes whatever else the machine is doing: the load beside a run must not
change the thread count torch computes with, nor the batches the sampler forms (docs/engine.md, "Speed and
determinism")."""
import json
import os
import subprocess
import sys

import pytest

from tokencredit.pipeline.models.loading import load_policy
from tokencredit.pipeline.sample.transformers_backend import AUTO_BATCH, AUTO_BATCH_BYTES, auto_batch

# Annotates the shipped tiny models (GDPO + MRTPO) with the default config in a fresh process; prints the
# dataset checksum as its last line.
CHILD = """
import json, sys, tempfile
from tokencredit.pipeline.annotate import AnnotateConfig, run_annotation
out = tempfile.mkdtemp(prefix="determinism_", dir=sys.argv[1])
manifest = run_annotation(AnnotateConfig(limit=4), out, progress=False)
print(json.dumps(manifest["dataset_checksum"]))
"""


def annotate(tmp_path, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_run_beside_a_busy_process_with_other_thread_defaults_writes_the_same_bytes(tmp_path):
    """Run A on its own; run B beside a process that keeps a core busy, started where OpenMP and MKL default to
    one thread (as a launcher on a loaded machine may set them). The config's `cpu_threads` (2) decides both
    runs' thread count (with the tiny policy 1 and 2 threads write different bytes:
    `test_thread_count_reaches_the_bytes`), and no verifier's bound counts the seconds its imports take
    (before that, run B's first response was a verifier_error past the 5 s bound), so the datasets are the
    same bytes."""
    quiet = annotate(tmp_path, {"OMP_NUM_THREADS": "2"})
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        loaded = annotate(tmp_path, {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    finally:
        busy.kill()
        busy.wait()
    assert loaded == quiet


@pytest.mark.slow
def test_thread_count_reaches_the_bytes(tmp_path):
    """The premise of the test above: the thread count torch computes with changes the tiny policy's bytes."""
    child = CHILD.replace("AnnotateConfig(limit=4)", "AnnotateConfig(limit=4, cpu_threads=1)")
    one = subprocess.run([sys.executable, "-c", child, str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-2000:]
    assert json.loads(one.stdout.strip().splitlines()[-1]) != annotate(tmp_path, {})


# In a fresh process: the tiny policy's samples of 2 instruction prompts, verified with a 2 s bound per response.
FIRST_VERIFY = """
from tokencredit.pipeline.annotate import AnnotateConfig, load_prompt_set, verify_samples
from tokencredit.pipeline.config import SamplingConfig
from tokencredit.pipeline.sample import make_sampler
records = load_prompt_set(AnnotateConfig(tasks=("instructions",), limit=2))[0]
samples = make_sampler("transformers").sample(records, SamplingConfig(n=2, max_new_tokens=16))
print([v.status for v in verify_samples(samples, {r.id: r for r in records}, timeout_s=2.0)])
"""


def test_the_first_response_is_not_bounded_by_the_verifiers_imports():
    """The instruction checks import NLTK, SciPy and langdetect's profiles on first use (3-4.5 s on this machine,
    more when it is busy); counted in the first response's bound, a loaded run made that response a
    verifier_error that a quiet run did not. They load before the bounded calls, so a 2 s bound holds for
    every response in a fresh process."""
    done = subprocess.run([sys.executable, "-c", FIRST_VERIFY], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == str(["ok"] * 4)


def test_the_automatic_batch_follows_from_the_model_and_config_alone():
    """The rows per forward when `batch_size` is None: a fixed memory budget, not the memory free at the time
    (a run under memory pressure sampled in other batches, hence other tokens)."""
    model, _ = load_policy(None)
    assert auto_batch(model, 256) == AUTO_BATCH
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 4
    context = AUTO_BATCH_BYTES // (per_token * 40)  # about 40 rows fit: the largest power of two below is 32
    assert auto_batch(model, context) == 32
