"""`tokencredit rounds`' wiring: the settings checked, the start policy scored on the dev prompts, then round by
round annotate (the annotate stage: in this process, or the annotate flow) -> train -> merge -> dev reward
(tokencredit.pipeline.rounds)."""
from __future__ import annotations

from pathlib import Path

from tokencredit.flows.stages import annotate_into
from tokencredit.pipeline.rounds import (RoundsConfig, annotate_config, check_settings, dev_records, finished, log,
                                         policy_after, round_folder, run_of, score_dev, train_round)


def run_rounds(config: RoundsConfig, out: Path, runner: str = "threads", after_round=None) -> list[dict]:
    """Every round not finished in `out`; each round's dev result, the start policy's first (none without dev
    prompts). Without dev prompts, `after_round(r)` is called once round r is finished (a finished round too: what
    it does must skip what is done): compare scores the round's policy on its own dev prompts there."""
    check_settings(config, out)
    if config.dev_split is None:
        for r in range(config.rounds):
            run_round(config, out, r, runner)
            if after_round is not None:
                after_round(r)
        return []
    records = dev_records(config)  # a prompt file without dev records is refused before any round runs
    start = score_dev(config, config.annotate.model, records, out / "start" / "dev.json", "start")
    log(f"start policy: dev reward {start['reward']:.4f} on {len(records)} prompts")
    results = [start]
    for r in range(config.rounds):
        run_round(config, out, r, runner)
        result = score_dev(config, policy_after(config, out, r), records, round_folder(out, r) / "dev.json",
                           f"round-{r:03d}")
        results.append(result)
        log(f"round {r + 1} of {config.rounds}: dev reward {result['reward']:.4f} "
            f"({result['reward'] - start['reward']:+.4f} over the start policy)")
    return results


def run_round(config: RoundsConfig, out: Path, r: int, runner: str) -> None:
    """Round r's annotate run (but a shared first run) and training, unless the round is finished."""
    if finished(config, out, r):
        return
    where, run = f"round {r + 1} of {config.rounds}", run_of(config, out, r)
    if not (r == 0 and config.first_run):
        log(f"{where}: annotate {run} from {policy_after(config, out, r - 1) or 'the shipped policy'}")
        annotate_into(annotate_config(config, out, r), str(run), runner)
    log(f"{where}: train {round_folder(out, r) / 'checkpoint'}")
    train_round(config, out, r)
