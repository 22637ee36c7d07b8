"""`tokencredit compare`'s wiring: register the design, annotate each pool (the annotate flow, or in this process
with runner 'none'), then seed by seed train and score every arm (tokencredit.pipeline.compare.run)."""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

from tokencredit.flows.stages import annotate_into
from tokencredit.pipeline.annotate import load_prompt_set

from tokencredit.pipeline.compare.design import Design
from tokencredit.pipeline.compare.registry import register
from tokencredit.pipeline.compare.run import (annotate_config, design_inputs, heldout_records, log, pool_complete,
                                              pool_folder, score_policy, scores_path, stage_backend, train_arm)


def annotate_pool(design: Design, name: str, out: Path, runner: str) -> Path:
    """The pool's annotate run in DIR/pools/NAME: the product's annotate stage, which resumes by shard."""
    pool = design.pools[name]
    folder = pool_folder(out, pool)
    if pool_complete(folder):
        return folder
    log(f"annotate pool {name}")
    config = annotate_config(design, pool, design.prompts["train_split"], design.prompts["train_limit"])
    planned = len(load_prompt_set(config)[0]) * (pool.n or math.prod(pool.tree)) * pool.max_new_tokens
    config = dataclasses.replace(config, backend=stage_backend(design, planned))
    annotate_into(config, str(folder), runner)
    return folder


def run_compare(design: Design, out: Path, runner: str = "threads") -> dict:
    """Every stage of the design into `out`, in an order that leaves whole seeds when stopped: the registration,
    the pools, the start policy's scores, then seed by seed every arm trained and scored. The registration."""
    registration = register(design, out, design_inputs(design))
    records = heldout_records(design)  # a design without held-out records is refused before its pools are annotated
    used = {arm.pool for arm in design.arms.values()}
    pools = {name: annotate_pool(design, name, out, runner) for name in design.pools if name in used}
    score_policy(design, "start", None, records, out)
    policies = [(seed, arm) for seed in design.seeds for arm in design.arms.values()]
    started, done_here = time.monotonic(), 0
    for i, (seed, arm) in enumerate(policies, 1):
        label = f"{arm.name}-{seed}"
        if scores_path(out, label).is_file():
            continue
        left = sum(not scores_path(out, f"{a.name}-{s}").is_file() for s, a in policies)
        pace = (time.monotonic() - started) / done_here if done_here else None
        log(f"policy {i} of {len(policies)}: {label}"
            + (f" (about {pace * left / 3600:.1f} h left at this run's pace)" if pace else ""))
        adapter = train_arm(design, arm, seed, pools[arm.pool], out)
        score_policy(design, label, adapter, records, out, arm=arm.name, seed=seed)
        done_here += 1
    return registration
