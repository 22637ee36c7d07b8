"""A policy's rewards on a prompt set, and the trained policies to score: `compare` scores each arm's policy on
held-out prompts with it, and `rounds` each round's policy on its dev prompts.

    load_merged(base, checkpoint)  the base policy with a trained checkpoint (LoRA adapter or full weights) merged in
    decode_rewards(sampler, ...)   per decode and prompt, the mean of its rewards and each reward's score
    train_or_base(config, label)   train's final checkpoint, or None where the run has nothing to train on
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from tokencredit.pipeline.interrupts import hold


def load_merged(base: str | None, checkpoint: Path | None, device: str = "cpu"):
    """(model, tokenizer): the policy `base` (registry name, folder, None: the shipped tiny policy), with the LoRA
    adapter or the full weights that `checkpoint` holds in their place; `base` alone where `checkpoint` is None."""
    from tokencredit.pipeline.models.loading import load_policy

    if checkpoint is None:
        return load_policy(base, device=device)
    if (checkpoint / "adapter_config.json").is_file():
        from peft import PeftModel

        model, tokenizer = load_policy(base, device=device)
        return PeftModel.from_pretrained(model, str(checkpoint)).merge_and_unload().eval(), tokenizer
    return load_policy(str(checkpoint), device=device)


def save_policy(policy, dest: Path) -> Path:
    """(model, tokenizer) saved as a policy folder that annotate, train and the engines load (safetensors),
    atomically: a temporary folder renamed to `dest`, so a kill leaves `dest` whole or absent."""
    import shutil

    tmp = dest.with_name(f"{dest.name}.tmp")
    if tmp.is_symlink():  # replaced, never written through to where it points
        tmp.unlink()
    shutil.rmtree(tmp, ignore_errors=True)
    policy[0].save_pretrained(tmp, safe_serialization=True)
    policy[1].save_pretrained(tmp)
    hold()  # an interrupt being handled: nothing computed during it is committed
    tmp.rename(dest)
    return dest


def decode_rewards(sampler, records, runs, refs) -> tuple[dict[str, dict[str, dict]], int]:
    """Every record decoded by `sampler` under each (name, SamplingConfig) of `runs` ("greedy" is one decode, any
    other name one decode per sample: NAME-1, NAME-2, ...) and verified with the built-in verifiers and `refs`
    (plugins). ({decode: {record id: {"reward": mean of its rewards (0 without one), "scores": {reward: score}}}},
    response tokens decoded)."""
    from tokencredit import verifiers

    by_id = {r.id: r for r in records}
    decodes: dict[str, dict[str, dict]] = {}
    tokens = 0
    for name, config in runs:
        seen: dict[str, int] = {}
        for sample in sampler.sample(records, config):
            j = seen.get(sample.group_id, 0)
            seen[sample.group_id] = j + 1
            decode = name if name == "greedy" else f"{name}-{j + 1}"
            scores = verifiers.verify(by_id[sample.group_id], sample.response, refs)
            names = verifiers.reward_names(by_id[sample.group_id], refs)
            decodes.setdefault(decode, {})[sample.group_id] = {
                "reward": statistics.fmean(s.score for s in scores) if scores else 0.0,
                "scores": {n: s.score for n, s in zip(names, scores)}}
            tokens += len(sample.token_ids)
    return decodes, tokens


UNTRAINED = "untrained.json"  # in a train folder: the run had nothing to train on, and why


def train_or_base(config, label: str, log=print) -> Path | None:
    """`train(config)`'s final checkpoint (resumed as train resumes; found and returned where it is there), or None
    where the run has nothing the objective trains on (rejection sampling with no response passing every reward,
    SFT with no positive weight): the policy stays as it was, and OUT/untrained.json says why. OUT/seconds.json:
    the training's seconds (`compare --plan`'s cost). ValueError naming `label` when training fails otherwise."""
    from tokencredit.pipeline.compare.registry import write_json
    from tokencredit.pipeline.train.trainer import train

    folder = Path(config.out)
    if (folder / "final").is_dir():
        return folder / "final"
    if (folder / UNTRAINED).is_file():
        return None
    start = time.perf_counter()
    try:
        final = train(config)
    except ValueError as error:
        if "no response has tokens to train on" not in str(error):  # e.g. a loss that is not finite: failed
            raise ValueError(f"train {label}: {error}") from error
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / UNTRAINED, {"reason": str(error)})
        log(f"{label} stays the policy it started from: {error}")
        return None
    write_json(folder / "seconds.json", {"seconds": round(time.perf_counter() - start, 2)})
    return final


def mean_reward(decodes: dict[str, dict[str, dict]]) -> float:
    """The mean over decodes and prompts of each prompt's reward."""
    return statistics.fmean(cell["reward"] for cells in decodes.values() for cell in cells.values())
