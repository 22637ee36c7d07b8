"""`tokencredit rounds`' wiring: the settings checked, the start policy scored on the dev prompts, then round by
round annotate (the annotate stage: in this process, or the annotate flow) -> train -> merge -> dev reward
(tokencredit.pipeline.rounds)."""
from __future__ import annotations

from pathlib import Path

from tokencredit.flows.stages import annotate_into
from tokencredit.pipeline.rounds import (RoundsConfig, annotate_config, check_settings, dev_records, log, round_folder,
                                         policy_after, score_dev, train_round)


def run_rounds(config: RoundsConfig, out: Path, runner: str = "threads") -> list[dict]:
    """Every round not finished in `out` (a finished one has its dev.json); each round's dev result, the start
    policy's first."""
    check_settings(config, out)
    records = dev_records(config)  # a prompt file without dev records is refused before any round runs
    start = score_dev(config, config.annotate.model, records, out / "start" / "dev.json", "start")
    log(f"start policy: dev reward {start['reward']:.4f} on {len(records)} prompts")
    results = [start]
    for r in range(config.rounds):
        folder = round_folder(out, r)
        done = folder / "dev.json"
        where = f"round {r + 1} of {config.rounds}"
        if not done.is_file():
            log(f"{where}: annotate {folder / 'run'} from {policy_after(config, out, r - 1) or 'the shipped policy'}")
            annotate_into(annotate_config(config, out, r), str(folder / "run"), runner)
            log(f"{where}: train {folder / 'checkpoint'}")
            train_round(config, out, r)
        result = score_dev(config, policy_after(config, out, r), records, done, f"round-{r:03d}")
        results.append(result)
        log(f"{where}: dev reward {result['reward']:.4f} ({result['reward'] - start['reward']:+.4f} over the start "
            "policy)")
    return results
