"""`tokencredit compare`'s wiring: register the design, annotate each pool (the annotate flow, or in this process
with runner 'none'), then seed by seed train (with [training] rounds > 1, in rounds: tokencredit.flows.rounds) and
score every arm (tokencredit.pipeline.compare.run)."""
from __future__ import annotations

import time
from pathlib import Path

from tokencredit.flows.rounds import run_rounds
from tokencredit.flows.stages import annotate_into
from tokencredit.pipeline.compare.design import Arm, Design
from tokencredit.pipeline.compare.registry import register
from tokencredit.pipeline.compare.run import (design_inputs, heldout_records, log, pool_complete, pool_config,
                                              pool_folder, rounds_config, score_policy, scores_path, train_arm)
from tokencredit.pipeline.rounds import policy_after


def annotate_pool(design: Design, name: str, out: Path, runner: str) -> Path:
    """The pool's annotate run in DIR/pools/NAME: the product's annotate stage, which resumes by shard."""
    pool = design.pools[name]
    folder = pool_folder(out, pool)
    if pool_complete(folder):
        return folder
    log(f"annotate pool {name}")
    annotate_into(pool_config(design, pool), str(folder), runner)
    return folder


def train_rounds(design: Design, arm: Arm, seed: int, pool: Path, out: Path, runner: str) -> Path | None:
    """(arm, seed)'s policy after [training] rounds rounds (`rounds_config`): its last merged policy folder, or None
    where no round trained anything (the base policy)."""
    config, folder = rounds_config(design, arm, seed, pool, out)
    log(f"rounds {arm.name} seed {seed}")
    run_rounds(config, folder, runner)
    policy = policy_after(config, folder, design.rounds - 1)
    return None if policy == config.annotate.model else Path(policy)


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
        adapter = (train_arm(design, arm, seed, pools[arm.pool], out) if design.rounds == 1
                   else train_rounds(design, arm, seed, pools[arm.pool], out, runner))
        score_policy(design, label, adapter, records, out, arm=arm.name, seed=seed)
        done_here += 1
    return registration
