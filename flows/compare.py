"""`tokencredit compare`'s wiring: register the design, annotate each pool (the annotate flow, or in this process
with runner 'none'), then seed by seed train (with [training] rounds > 1, in rounds: tokencredit.flows.rounds) and
score every arm (tokencredit.pipeline.compare.run), each arm's policies on the dev prompts after each round."""
from __future__ import annotations

import time
from pathlib import Path

from tokencredit.flows.rounds import run_rounds
from tokencredit.flows.stages import annotate_into
from tokencredit.pipeline.compare.design import Arm, Design
from tokencredit.pipeline.compare.registry import register
from tokencredit.pipeline.compare.run import (design_inputs, dev_label, dev_path, dev_records, heldout_records, log,
                                              pool_complete, pool_config, pool_folder, rounds_config, score_policy,
                                              scores_path, train_arm)
from tokencredit.pipeline.rounds import policy_after, prune_policies


def annotate_pool(design: Design, name: str, out: Path, runner: str) -> Path:
    """The pool's annotate run in DIR/pools/NAME: the product's annotate stage, which resumes by shard."""
    pool = design.pools[name]
    folder = pool_folder(out, pool)
    if pool_complete(folder):
        return folder
    log(f"annotate pool {name}")
    annotate_into(pool_config(design, pool), str(folder), runner)
    return folder


def train_rounds(design: Design, arm: Arm, seed: int, pool: Path, out: Path, runner: str, dev: list) -> Path | None:
    """(arm, seed)'s policy after [training] rounds rounds (`rounds_config`): its last merged policy folder, or None
    where no round trained anything (the base policy). Each round's policy is scored on the `dev` prompts once it
    is written, and the round before's deleted once this one's is (`prune_policies`): kept policies of a folder
    written before dev prompts existed are scored the same way when it resumes."""
    config, folder = rounds_config(design, arm, seed, pool, out)

    def policy(r: int) -> Path | None:
        found = policy_after(config, folder, r)
        return None if found == config.annotate.model else Path(found)

    def after_round(r: int) -> None:
        label = dev_label(arm.name, seed, r)
        if dev and not dev_path(out, label).is_file():
            score_policy(design, label, policy(r), dev, out, arm=arm.name, seed=seed, dev_round=r)
        prune_policies(folder, r)

    log(f"rounds {arm.name} seed {seed}")
    run_rounds(config, folder, runner, after_round)
    return policy(design.rounds - 1)


def arm_done(design: Design, arm: Arm, seed: int, out: Path, dev: list, dev_only: bool) -> bool:
    """Whether (arm, seed) has every score the run writes: held-out (but with --dev-only) and each round's dev."""
    label = f"{arm.name}-{seed}"
    return ((dev_only or scores_path(out, label).is_file())
            and all(dev_path(out, dev_label(arm.name, seed, r)).is_file() for r in range(design.rounds) if dev))


def run_compare(design: Design, out: Path, runner: str = "threads", dev_only: bool = False) -> dict:
    """Every stage of the design into `out`, in an order that leaves whole seeds when stopped: the registration,
    the pools, the start policy's scores, then seed by seed every arm trained (each round's policy scored on the
    dev prompts) and scored on the held-out prompts. With `dev_only`, no held-out record is scored (the registration
    hashes the prompt file, as any run's).
    The registration."""
    dev = dev_records(design)
    if dev_only and not dev:  # refused before the folder is registered
        raise ValueError(f"--dev-only: the design has no dev prompts (the train split's records after [prompts] "
                         f"train_limit = {design.prompts['train_limit']} per task)")
    registration = register(design, out, design_inputs(design))
    # a design without held-out records is refused before its pools are annotated
    records = None if dev_only else heldout_records(design)
    used = {arm.pool for arm in design.arms.values()}
    pools = {name: annotate_pool(design, name, out, runner) for name in design.pools if name in used}
    if not dev_only:
        score_policy(design, "start", None, records, out)
    if dev:
        score_policy(design, "start", None, dev, out, dev_round=-1)
    policies = [(seed, arm) for seed in design.seeds for arm in design.arms.values()]
    started, done_here = time.monotonic(), 0
    for i, (seed, arm) in enumerate(policies, 1):
        label = f"{arm.name}-{seed}"
        if arm_done(design, arm, seed, out, dev, dev_only):
            continue
        left = sum(not arm_done(design, a, s, out, dev, dev_only) for s, a in policies)
        pace = (time.monotonic() - started) / done_here if done_here else None
        log(f"policy {i} of {len(policies)}: {label}"
            + (f" (about {pace * left / 3600:.1f} h left at this run's pace)" if pace else ""))
        if design.rounds == 1:
            adapter = train_arm(design, arm, seed, pools[arm.pool], out)
            if dev:
                score_policy(design, dev_label(arm.name, seed, 0), adapter, dev, out, arm=arm.name, seed=seed,
                             dev_round=0)
        else:
            adapter = train_rounds(design, arm, seed, pools[arm.pool], out, runner, dev)
        if not dev_only:
            score_policy(design, label, adapter, records, out, arm=arm.name, seed=seed)
        done_here += 1
    return registration
