"""Per-step time of `train` (transformers.Trainer) over a bare loop of `train_step` on the same batches.

    python -m bench train [--quick]

The run: the demo records' prompts (sampling layout) and reference responses (at most 64 tokens), tokenized
with the model's tokenizer, written through RunWriter with random per-token advantages; PG on them (`mrtpo`)
with LoRA, micro-batches of 2 accumulated over 2 per step. The Trainer side is `train` itself (metrics.csv,
logging, its dataloader); the loop side is AdamW + `train_step` on batch_indices' micro-batches with the
same LoRA model, nothing else. A step's time is the wall time between two consecutive step ends (the
first step, with the optimizer's set-up, is left out); the two sides run in turns in one process and each
ratio is of medians. Checkpoints are written only after the last step (save_every = steps, with AdamW's
moments), outside the timed steps; their size is reported.

Full mode: SmolLM2-135M-Instruct (`smollm2-135m-instruct`, pulled) and the shipped tiny policy; --quick:
the tiny policy only, into a temporary results folder. Target: trainer_over_loop (SmolLM2) <= 1.1 and the LoRA
checkpoint folder under 50 MB. Figures go to bench/results/train.json and bench/RESULTS.md.
"""
from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import transformers

from common import Harness, mib
from registry import Target, benchmark

TARGET, SIZE_TARGET = 1.1, 50 * 2**20
BATCH, ACCUM, LR = 2, 2, 1e-4


def write_run(folder: Path, model: str | None, tokenizer, n: int) -> str:
    """A complete run of n demo responses (groups of 4) tokenized with `tokenizer`, its manifest naming `model`."""
    from tokencredit import verifiers
    from tokencredit.pipeline.dataset.writer import RunWriter
    from tokencredit.pipeline.sample.prompts import sampling_prompt
    from tokencredit.schemas import CREDITS, RESPONSES

    records, _ = verifiers.load_tasks("demo")
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        r = records[(i // 4) % len(records)]
        prompt = tokenizer(sampling_prompt(r.prompt))["input_ids"]
        tokens = tokenizer(r.reference_response, add_special_tokens=False)["input_ids"][:64]
        rows.append({
            "response_id": f"r{i}", "group_id": f"g{i // 4}", "shard": 0, "task": r.task, "prompt": r.prompt,
            "response": tokenizer.decode(tokens), "prompt_token_ids": prompt, "token_ids": tokens,
            "sample_logprobs": (-rng.random(len(tokens))).tolist(), "reward_names": ["r"], "rewards": [1.0],
            "feedback": ["ok"], "reward_advs": [0.0], "adv_grpo": 0.0, "gdpo_sum": 0.0,
            "mrtpo_sum": rng.normal(size=len(tokens)).tolist(), "p2t_raw": None, "p2t_reward": None,
            "p2t_alpha": None, "status": "ok", "model": str(model), "seed": 0})
    writer = RunWriter(str(folder))
    writer.start("bench", {"model": model, "credit": {"gdpo": {"batch": "none"}}}, "bench", "bench")
    writer.write_shard(0, {"responses": pa.Table.from_pylist(rows, schema=RESPONSES),
                           "credits": CREDITS.empty_table()}, stats={})
    writer.finish(1, {})
    return str(folder)


class StepEnds(transformers.TrainerCallback):
    def __init__(self):
        self.times: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter())


def trainer_steps(config) -> tuple[list[float], int]:
    """(seconds of steps 2..n, bytes of the last checkpoint folder) of `train(config)` in a fresh out dir."""
    from tokencredit.pipeline.train.trainer import train

    shutil.rmtree(config.out, ignore_errors=True)
    ends = StepEnds()
    train(config, callbacks=[ends])
    checkpoint = Path(config.out) / f"checkpoint-{config.steps}"
    return list(np.diff(ends.times)), sum(p.stat().st_size for p in checkpoint.rglob("*") if p.is_file())


def loop_steps(config) -> list[float]:
    """Seconds of steps 2..n of AdamW + train_step on the same micro-batches and a fresh LoRA model."""
    import torch

    from tokencredit.pipeline.train.trainer import batch_indices, collate, load_examples, load_model, train_step

    examples = load_examples(config.data, config.advantage, config.objective)
    torch.manual_seed(config.seed)
    model, tokenizer = load_model(config, None)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr)
    ends = []
    for step in range(config.steps):
        indices = batch_indices(len(examples), config.batch_size * config.grad_accum, config.seed, step)
        micro = [collate([examples[i] for i in indices[m:m + config.batch_size]], tokenizer.pad_token_id or 0)
                 for m in range(0, len(indices), config.batch_size)]
        train_step(model, micro, config.objective, optimizer, config.clip_eps)
        ends.append(time.perf_counter())
    return list(np.diff(ends))


def measure(name: str | None, label: str, steps: int, rounds: int, tmp: Path) -> dict:
    from tokencredit.pipeline.models.loading import load_policy
    from tokencredit.pipeline.train.trainer import TrainConfig

    _, tokenizer = load_policy(name)
    data = write_run(tmp / f"run-{label}", name, tokenizer, 32)
    config = TrainConfig(data=data, out=str(tmp / f"out-{label}"), model=name, advantage="mrtpo", steps=steps,
                         batch_size=BATCH, grad_accum=ACCUM, lr=LR, lora=True, save_every=steps, save_optimizer=True)
    times: dict[str, list[float]] = {"trainer": [], "loop": []}
    for _ in range(rounds):  # in turns, so that load from other processes falls on both sides alike
        trainer, size = trainer_steps(config)
        times["trainer"] += trainer
        times["loop"] += loop_steps(config)
    medians = {k: statistics.median(v) for k, v in times.items()}
    result = {"model": label, "steps": steps, "rounds": rounds, "trainer_step_s": medians["trainer"],
              "loop_step_s": medians["loop"], "trainer_over_loop": medians["trainer"] / medians["loop"],
              "lora_checkpoint_bytes": size, "raw_s": times}
    print(f"{label}: trainer {medians['trainer']:.3f} s/step, loop {medians['loop']:.3f} s/step = "
          f"{result['trainer_over_loop']:.3f}x; LoRA checkpoint-{steps} {mib(size)}")
    return result


@benchmark("train", measures="`train` on transformers.Trainer against AdamW + `train_step` on the same "
           "micro-batches, LoRA (r 8, every linear layer), PG on `mrtpo`: seconds per optimizer step (first step left "
           "out), the sides in turns in one process, medians; SmolLM2 and the tiny policy.", results=("train.json",),
           targets=(Target("trainer_over_loop", "<=", TARGET), Target("lora_checkpoint_bytes", "<", SIZE_TARGET)))
def run(h: Harness) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench_train_", dir="/tmp"))
    try:
        tiny = measure(None, "tiny", steps=3 if h.quick else 13, rounds=1 if h.quick else 3, tmp=tmp)
        smol = tiny if h.quick else measure("smollm2-135m-instruct", "smollm2-135m-instruct", steps=6, rounds=3, tmp=tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    h.repeats = smol["rounds"]
    figures = {"trainer_over_loop": round(smol["trainer_over_loop"], 3), "model": smol["model"],  # machine: the row's
               "batch_size": BATCH, "grad_accum": ACCUM, "smollm2": smol, "tiny": tiny}
    h.results("train.json").write_text(json.dumps(figures, indent=2) + "\n")
    return figures | {"lora_checkpoint_bytes": smol["lora_checkpoint_bytes"]}
