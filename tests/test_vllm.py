"""The vllm backend on real engine runs (CPU: vllm-cpu, which the README's install command brings).

One engine per (model, dtype) for the whole session: `make_sampler` keeps them, and the annotate runs below reuse
them in this process. Bounds on log-probs come from bench/results/engine_choice.json (docs/engine.md).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pyarrow.dataset as ds
import pytest
import torch

from tokencredit.pipeline.annotate import run_annotation
from tokencredit.pipeline.config import AnnotateConfig, CreditConfig, SamplingConfig
from tokencredit.pipeline.sample import _ENGINES, load_sampler, make_sampler, release_sampler
from tokencredit.pipeline.sample.rows import node_seed, render_prompt
from tokencredit.pipeline.sample.tree import continue_prefixes
from tokencredit.verifiers import load_tasks

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vllm is not installed (the README's install command brings it)")]
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: the tiny policy needs little; the machine is shared

# |stored log-prob - float32 forward| per token: the float32 engine measured at most ~1e-5 on the tiny policy
# and 4.7e-5 on SmolLM2 (bench/results/engine_choice.json); bfloat16 up to ~0.25 on SmolLM2
FP32_BOUND, BF16_BOUND = 1e-3, 0.5
THREADS = AnnotateConfig.cpu_threads  # the engine annotate's runs start, so the session shares one


@pytest.fixture
def engine():
    """The session's float32 engine on the tiny policy (started again only after a test that started another:
    one engine per process)."""
    sampler = make_sampler("vllm", None, device="cpu", dtype="float32", threads=THREADS)
    sampler.progress = False
    return sampler


@pytest.fixture(scope="module")
def hf():
    sampler = make_sampler("transformers")
    sampler.progress = False
    return sampler


@pytest.fixture(scope="module")
def records():
    return load_tasks("demo", "native")[0][:6]


def forward_logprobs(model, samples) -> list[list[float]]:
    """A float32 teacher-forced forward's log-prob of each response token."""
    out = []
    with torch.inference_mode():
        for s in samples:
            ids = torch.tensor([s.prompt_token_ids + s.token_ids])
            logits = model(input_ids=ids).logits[0, len(s.prompt_token_ids) - 1:-1].float()
            out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.token_ids)[:, None])[:, 0].tolist())
    return out


def test_float32_greedy_tokens_are_the_transformers_backends(engine, hf, records):
    greedy = SamplingConfig(n=1, temperature=0.0, max_new_tokens=32)
    ours, theirs = engine.sample(records, greedy), hf.sample(records, greedy)
    assert [s.token_ids for s in ours] == [s.token_ids for s in theirs]
    assert [s.response for s in ours] == [s.response for s in theirs]
    assert [s.prompt_token_ids for s in ours] == [s.prompt_token_ids for s in theirs]
    for a, b in zip(ours, theirs):
        assert a.sample_logprobs == pytest.approx(b.sample_logprobs, abs=FP32_BOUND)


def test_float32_stored_logprobs_are_a_float32_forwards(engine, hf, records):
    assert logprob_differences(engine, hf, records) <= FP32_BOUND


def logprob_differences(sampler, hf, records) -> float:
    """The largest |stored log-prob - float32 forward's| over sampled responses."""
    samples = sampler.sample(records, SamplingConfig(n=2, max_new_tokens=32, seed=4))
    reference = forward_logprobs(hf.model, samples)
    diffs = [abs(a - b) for s, ref in zip(samples, reference) for a, b in zip(s.sample_logprobs, ref)]
    assert len(diffs) > 100
    return max(diffs)


def test_a_records_samples_do_not_depend_on_its_batch(engine, records):
    config = SamplingConfig(n=3, max_new_tokens=24, seed=9)
    together = engine.sample(records, config)
    alone = [s for r in records[::-1] for s in engine.sample([r], config)]
    by_id = {s.response_id: s.token_ids for s in alone}
    assert [s.token_ids for s in together] == [by_id[s.response_id] for s in together]
    other = engine.sample(records, dataclasses.replace(config, seed=10))
    assert [s.token_ids for s in other] != [s.token_ids for s in together]


@pytest.mark.parametrize("branch", ["fraction:0.25", "sentence"])
def test_tree_leaves_continue_their_root_with_their_seeds(engine, records, branch):
    config = SamplingConfig(tree=(2, 3), max_new_tokens=24, temperature=1.0, seed=5, branch=branch)
    samples = engine.sample(records, config)
    assert [s.response_id for s in samples] == [f"{r.id}/{j}" for r in records for j in range(6)]
    prompts = {r.id: render_prompt(engine.tokenizer, r.prompt)[1] for r in records}
    roots, branched = {}, 0
    for s in samples:
        assert s.segments[0].start == 0 and s.segments[-1].end == len(s.token_ids)
        assert all(a.end == b.start for a, b in zip(s.segments, s.segments[1:]))
        assert [g.parent_id for g in s.segments] == [None, s.segments[0].node_id]
        roots.setdefault((s.group_id, s.segments[0].node_id), []).append(s)
    for (record_id, root), leaves in roots.items():
        cut = leaves[0].segments[0].end
        prefix = leaves[0].token_ids[:cut]
        assert all(leaf.token_ids[:cut] == prefix for leaf in leaves)
        root_seed = node_seed(config.seed, record_id, root.split("/")[-1])
        assert engine.generate([prompts[record_id]], [root_seed], config)[0][0][:cut] == prefix
        if cut == len(leaves[0].token_ids):  # ended before its branch point: copies of the root
            assert all(leaf.token_ids == prefix for leaf in leaves)
            continue
        branched += 1
        if branch == "sentence":
            assert engine.tokenizer.decode([prefix[-1]]).rstrip()[-1:] in ".!?" or "\n" in engine.tokenizer.decode(
                [prefix[-1]])
        else:
            assert cut == config.branch_tokens
        seeds = [node_seed(config.seed, record_id, leaf.segments[1].node_id.split("/")[-1]) for leaf in leaves]
        continued = continue_prefixes(engine, [prompts[record_id]], [prefix], [seeds], config)[0]
        assert [leaf.token_ids[cut:] for leaf in leaves] == [tokens for tokens, _ in continued]
    assert branched >= 2


def test_entropy_branching_is_refused_in_one_line(engine, records):
    with pytest.raises(ValueError, match="--branch entropy:0.2: the vllm backend .* use --branch sentence"):
        engine.sample(records[:1], SamplingConfig(tree=(2, 2), branch="entropy:0.2", max_new_tokens=8))


def small_config(backend: str, **sampling) -> AnnotateConfig:
    return AnnotateConfig(limit=2, shard_size=2, backend=backend, credit=CreditConfig(kinds=("gdpo", "mrtpo")),
                          sampling=SamplingConfig(max_new_tokens=24, seed=3, **sampling))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same small config annotated by each backend (flat), and a vllm tree run."""
    root = tmp_path_factory.mktemp("runs")
    made = {backend: run_annotation(small_config(backend), str(root / backend), progress=False)
            for backend in ("transformers", "vllm")}
    made["tree"] = run_annotation(small_config("vllm", tree=(2, 2)), str(root / "tree"), progress=False)
    return root, made


def test_views_exports_and_train_read_a_vllm_run_as_a_transformers_run(runs, tmp_path):
    from tokencredit.pipeline.dataset.export import export_hf
    from tokencredit.pipeline.dataset.query import run_query
    from tokencredit.pipeline.train.trainer import TrainConfig, train

    root, manifests = runs
    assert manifests["vllm"]["config"]["backend"] == "vllm" and manifests["vllm"]["config"]["dtype"] == "float32"
    assert manifests["vllm"]["totals"]["responses"] == manifests["transformers"]["totals"]["responses"] > 0
    for table in ("responses", "credits"):
        assert ds.dataset(root / "vllm" / table).schema == ds.dataset(root / "transformers" / table).schema
    for view in ("responses", "credits", "training"):  # the same columns; rows: the responses' own tokens
        shapes = [run_query(root / backend, f"select * from {view}") for backend in ("transformers", "vllm")]
        assert [c[0] for c in shapes[0].description] == [c[0] for c in shapes[1].description]
        counts = [len(shape.fetchall()) for shape in shapes]
        assert min(counts) > 0 and (view == "credits" or counts[0] == counts[1])
    for backend in ("transformers", "vllm"):
        export_hf(root / backend, tmp_path / f"hf-{backend}", advantage="mrtpo")
        final = train(TrainConfig(data=str(root / backend), out=str(tmp_path / f"ckpt-{backend}"), steps=2,
                                  batch_size=2, advantage="mrtpo"))
        assert (final / "model.safetensors").is_file()
    import datasets

    a, b = (datasets.load_from_disk(str(tmp_path / f"hf-{x}")) for x in ("transformers", "vllm"))
    assert a.features == b.features and len(a) == len(b)


def test_a_vllm_tree_run_has_the_node_table_of_its_trees(runs):
    from tokencredit.pipeline.dataset.query import run_query

    root, manifests = runs
    out = root / "tree"
    groups = manifests["tree"]["totals"]["responses"] // 4
    nodes = {n[0]: n for n in run_query(out, "select node_id, parent_id, group_id, depth, start, \"end\", leaves "
                                             "from nodes").fetchall()}
    assert len(nodes) == manifests["tree"]["totals"]["nodes"] == groups * (2 + 2 * 2)
    for response_id, group_id, segments in run_query(out, "select response_id, group_id, segments from "
                                                          "responses").fetchall():
        for depth, g in enumerate(segments):
            assert nodes[g["node_id"]][1:6] == (g["parent_id"], group_id, depth, g["start"], g["end"])


def test_a_vllm_run_is_byte_reproducible(runs, tmp_path):
    root, _ = runs
    again = run_annotation(small_config("vllm"), str(tmp_path / "again"), progress=False)
    for table in ("responses", "credits"):
        key = "response_id"
        rows = [sorted(ds.dataset(folder / table).to_table().to_pylist(), key=lambda r: r[key])
                for folder in (root / "vllm", tmp_path / "again")]
        assert rows[0] == rows[1]
    assert again["totals"]["responses"] > 0


def test_values_and_repair_sample_on_the_engine(runs, tmp_path):
    from tokencredit.pipeline.dataset.derived import run_derived
    from tokencredit.pipeline.repair import REPAIR, RepairConfig
    from tokencredit.pipeline.values import VALUES_KIND, ValuesConfig

    root, _ = runs
    sampler, _ = load_sampler("auto", None, "cpu")
    assert sampler is make_sampler("vllm", None, device="cpu")  # auto picks the installed engine
    before = sampler.decoded_tokens
    values = run_derived(VALUES_KIND, str(root / "vllm"), str(tmp_path / "values"), ValuesConfig(k=2, cuts=2),
                         progress=False, backend="vllm")
    repair = run_derived(REPAIR, str(root / "vllm"), str(tmp_path / "repair"), RepairConfig(n=2), progress=False,
                         backend="vllm")
    assert sampler.decoded_tokens > before
    assert values and repair


def test_the_derived_flow_starts_its_engine_again_once_it_was_stopped():
    """An in-process `run_derived` (or any engine's start) stops the engine the flow's model cache kept; the flow's
    next run on threads then starts it again instead of failing on a stopped engine (CI's test_interrupts)."""
    from tokencredit.flows.derived import _models

    sampler, _ = _models(None, "cpu", "vllm")
    release_sampler(sampler)
    again, _ = _models(None, "cpu", "vllm")
    assert again is not sampler and again.llm is not None
    assert _models(None, "cpu", "vllm")[0] is again


def test_a_dask_worker_starts_one_engine_and_writes_the_in_process_rows(prefect_harness, runs, tmp_path):
    from tokencredit.flows.annotate import run_annotate_flow

    root, manifests = runs
    dask = run_annotate_flow(small_config("vllm"), str(tmp_path / "dask"), runner="dask", workers=1, progress=False)
    assert dask["n_shards"] == manifests["vllm"]["n_shards"] > 1
    for table in ("responses", "credits"):
        rows = [sorted(ds.dataset(folder / table).to_table().to_pylist(), key=lambda r: json.dumps(r, default=str))
                for folder in (root / "vllm", tmp_path / "dask")]
        assert rows[0] == rows[1]
    # each shard's marker names the process that computed it: one worker, which started one engine for all of them
    workers = [entry["worker"] for entry in dask["shards"].values()]
    assert len({w["pid"] for w in workers}) == 1 and os.getpid() not in {w["pid"] for w in workers}
    assert {w["engine_starts"] for w in workers} == {1}


@pytest.mark.slow
def test_a_vllm_run_killed_mid_run_resumes_without_duplicates_or_gaps(tmp_path):
    out = tmp_path / "killed"
    args = ["annotate", "--out", str(out), "--limit", "3", "--shard-size", "1", "--max-new-tokens", "24",
            "--seed", "7", "--credit", "gdpo", "--runner", "none", "--backend", "vllm", "--verifier-timeout", "120"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tokencredit.flows.cli", *args], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 600
    while not list((out / "_shards").glob("*.json")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    written = len(list((out / "_shards").glob("*.json")))
    total = 3 * 3  # tasks x prompts: one shard each
    assert 1 <= written < total, f"the kill should land mid-run ({written} of {total} shards written)"
    resumed = subprocess.run([sys.executable, "-m", "tokencredit.flows.cli", *args], env=env, capture_output=True,
                             text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["backend"] == "vllm"
    rows = ds.dataset(out / "responses").to_table().to_pylist()
    ids = [r["response_id"] for r in rows]
    assert len(ids) == len(set(ids)) == manifest["totals"]["responses"]
    assert {r["group_id"] for r in rows} == {i.rsplit("/", 1)[0] for i in ids}
    assert sorted(ids) == sorted(f"{g}/{j}" for g in {r["group_id"] for r in rows} for j in range(4))


def test_refusals_name_what_is_missing(tmp_path):
    from tokencredit.pipeline.models.loading import DEFAULT_POLICY

    tiny = str(DEFAULT_POLICY)  # not the session's engine (model None), so each call builds a sampler
    with pytest.raises(RuntimeError, match=r"--device cuda: the installed vllm is built for cpu; --device cuda "
                                           r"needs the \[gpu\] extra"):
        make_sampler("vllm", tiny, device="cuda")
    with pytest.raises(RuntimeError, match=r"--device tpu: the vllm backend runs on cpu or cuda"):
        make_sampler("vllm", tiny, device="tpu")
    with pytest.raises(RuntimeError, match=r"--kv-cache 100000.0 GiB: more than the .* GiB of memory available"):
        make_sampler("vllm", tiny, device="cpu", kv_cache_bytes=100000 << 30)
    with pytest.raises(ValueError, match=r"--dtype int8: the vllm backend runs in bfloat16, float16, float32"):
        make_sampler("vllm", tiny, device="cpu", dtype="int8")
    with pytest.raises(FileNotFoundError, match=r"nothing': not a registry name, no such local folder"):
        make_sampler("vllm", str(tmp_path / "nothing"), device="cpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"model folder .*empty' has no config.json"):
        make_sampler("vllm", str(tmp_path / "empty"), device="cpu")
    broken = shutil.copytree(DEFAULT_POLICY, tmp_path / "broken")  # weights of an architecture vLLM does not know
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchForCausalLM"]}))
    with pytest.raises(RuntimeError, match=r"the vllm engine could not load .*broken on cpu: \w+"):
        make_sampler("vllm", str(broken), device="cpu")


def test_cli_auto_picks_the_engine_from_the_run_size():
    from tokencredit.flows.cli import annotate_config, build_parser
    from tokencredit.pipeline.sample.choice import BREAK_EVEN_TOKENS

    def chosen(*extra, notes=None):
        return annotate_config(build_parser().parse_args(["annotate", "--out", "x", *extra]), notes).backend

    notes: list[str] = []
    assert chosen("--limit", "1", "--max-new-tokens", "8", notes=notes) == "transformers"
    assert len(notes) == 1 and "fewer than the" in notes[0], notes  # the line annotate prints once inputs are checked
    per_prompt = 4 * 256  # responses x tokens (the tiny policy's context is 512)
    prompts = -(-BREAK_EVEN_TOKENS["cpu"] // per_prompt)  # ceil: the tokens reach the break-even
    assert chosen("--limit", str(prompts), "--max-new-tokens", "256", "--tasks", "sql") == "vllm"
    assert chosen("--limit", "1", "--dtype", "bfloat16") == "vllm"


def test_a_rounds_dev_reward_is_decoded_by_an_engine_of_the_runs_dtype(records, tmp_path):
    """`rounds --dtype bfloat16` samples its rounds in bfloat16: each policy's dev reward is decoded in it too."""
    from tokencredit.pipeline.rounds import RoundsConfig, score_dev

    annotate = AnnotateConfig(prompts="demo", backend="vllm", dtype="bfloat16", cpu_threads=THREADS,
                              sampling=SamplingConfig(n=1, max_new_tokens=6))
    config = RoundsConfig(annotate=annotate, train=None, rounds=1)
    scored = score_dev(config, None, records[:2], tmp_path / "dev.json", "start")
    assert scored["dtype"] == "bfloat16" and set(scored["rewards"]) == {r.id for r in records[:2]}
    assert json.loads((tmp_path / "dev.json").read_text()) == scored and not _ENGINES  # the engine is released


def test_bfloat16_stored_logprobs_move_within_their_bound_and_an_engine_is_released(hf, records):
    """Last: another engine stops the session's (one engine per process)."""
    sampler = make_sampler("vllm", None, device="cpu", dtype="bfloat16", threads=THREADS)
    sampler.progress = False
    assert sampler.dtype == "bfloat16" and list(_ENGINES.values()) == [sampler]
    assert FP32_BOUND < logprob_differences(sampler, hf, records) <= BF16_BOUND  # bfloat16 moves them
    release_sampler(sampler)  # a process that scores many policies frees each engine
    assert sampler.llm is None and not _ENGINES
    with pytest.raises(RuntimeError, match="was stopped .* make_sampler starts it again"):
        sampler.sample(records[:1], SamplingConfig(n=1, max_new_tokens=4))


# What vLLM prints of its own: its log format ("(MainProcess pid=1) INFO 12-07 14:42:01 [hf.py:646] ..."), a vllm
# logger's record through Prefect's console handler ("| WARNING | vllm.triton_utils..."), its CPU extension's C++
# warnings ("[W1207 14:40:27.637848859 utils.cpp:68] Warning: NUMA binding ..."), its progress bars
ENGINE_LINES = (r"\b(INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d \[", r"\| (INFO|WARNING) +\| vllm\b", r"^\[W\d{4} ",
                r"Processed prompts|Adding requests|Loading safetensors|Rendering prompts")


def engine_lines(text: str) -> list[str]:
    import re

    return [line for line in text.splitlines() if any(re.search(p, line) for p in ENGINE_LINES)]


@pytest.mark.slow
def test_a_default_engine_run_prints_no_engine_log_and_verbose_shows_it(tmp_path):
    """The acceptance's check: a default `annotate --backend vllm` (the Prefect flow, the engine in this process)
    prints tokencredit's lines alone; `--verbose` shows the engine's."""
    args = ["annotate", "--limit", "1", "--tasks", "sql", "--n", "2", "--max-new-tokens", "8", "--credit", "gdpo",
            "--backend", "vllm"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_LOGGING", "TOKENCREDIT_VERBOSE"))}
    runs = {}
    for name, extra in (("default", []), ("verbose", ["--verbose"])):
        runs[name] = subprocess.run([sys.executable, "-m", "tokencredit.flows.cli", *args, "--out",
                                     str(tmp_path / name), *extra], env=env, capture_output=True, text=True,
                                    timeout=900)
        assert runs[name].returncode == 0, runs[name].stderr[-3000:]
    default = runs["default"].stdout + runs["default"].stderr
    assert engine_lines(default) == [], default[-3000:]
    assert "sampling: 2/2 responses" in default  # tokencredit's own progress stays
    assert engine_lines(runs["verbose"].stderr)
