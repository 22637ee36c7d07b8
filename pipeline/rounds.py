"""`tokencredit rounds`: R rounds of annotate -> train, each from the policy the round before trained (expert
iteration, iterated offline RL), every round's folders kept and its policy scored on dev prompts.

    OUT/rounds.json             the settings (annotate config of the start policy, training, dev prompts), written
                                first; a rerun under other settings is refused, except a larger --rounds
    OUT/start/dev.json          the start policy's dev reward
    OUT/round-000/run/          round 0's annotate run, sampled from the start policy (resumes by shard)
    OUT/round-000/checkpoint/   train's folder on that run (resumes from its latest checkpoint); final/ the trained
                                weights (LoRA: the adapter), or untrained.json where the run had nothing to train on
    OUT/round-000/policy/       the round's policy, the one it started from with final/ merged in: round 1 samples
                                and trains from it (absent where the round trained nothing: the policy stays)
    OUT/round-000/dev.json      the round's policy's dev reward: written last, it marks the round finished
    OUT/round-000/policy-deleted.json  with `prune_policies` (compare's rounds), in place of policy/ once a later
                                round wrote its own: the round is finished, its checkpoint kept

Round r samples with seed `sampling.seed + r` and trains with seed `train.seed + r` on the same prompt set. Every
file is written atomically and each stage skips what is there, so a run killed at any point (kill -9 included)
resumes at the stage it was in with the rows an uninterrupted run writes. `compare`'s arms with [training] rounds
run the same rounds without dev prompts of their own (a round is finished once its policy is written; compare scores
it on its dev prompts after the round and then deletes the policy of the round before, `prune_policies`), round 0
training on the comparison's shared pool (`first_run`) rather than on a run of its own.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

from tokencredit.pipeline.config import AnnotateConfig, SamplingConfig
from tokencredit.pipeline.names import inside
from tokencredit.pipeline.scoring import (UNTRAINED, decode_rewards, load_merged, mean_reward, save_policy,
                                          train_or_base)

SETTINGS = "rounds.json"
PRUNED = "policy-deleted.json"  # in a round's folder: its merged policy was deleted, a later round's replacing it


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] rounds: {message}", flush=True)


@dataclass(frozen=True)
class RoundsConfig:
    """`annotate`: the start policy's annotate config (its model, sampling and credit); `train`: a TrainConfig whose
    data, out, model and seed each round sets; `rounds`: R; dev prompts: `dev_split` of the prompt file, `dev_limit`
    per task (None: all); `first_run`: round 0's run where it is shared (compare's pool, which every arm starts
    from)."""

    annotate: AnnotateConfig
    train: object  # TrainConfig (its module loads torch: imported when a round trains)
    rounds: int
    dev_split: str | None = "test"  # None: no dev prompts, no dev.json (compare scores the last round's policy)
    dev_limit: int | None = 32
    first_run: str | None = None  # an annotate run of `annotate` that round 0 trains on instead of its own

    def __post_init__(self) -> None:
        if not isinstance(self.rounds, int) or isinstance(self.rounds, bool) or self.rounds < 1:
            raise ValueError(f"rounds: {self.rounds!r}; expected an integer >= 1")
        if self.dev_limit is not None and self.dev_limit < 1:
            raise ValueError(f"dev limit: {self.dev_limit!r}; expected a positive number of prompts per task")

    def settings(self) -> dict:
        """What a rerun must share with the first run (JSON types), --rounds apart."""
        train = {k: v for k, v in dataclasses.asdict(self.train).items() if k not in ("data", "out", "model")}
        return json.loads(json.dumps({"annotate": self.annotate.to_dict(), "train": train,
                                      "dev": {"split": self.dev_split, "limit": self.dev_limit},
                                      "round 0": {"run": self.first_run}}))

    @classmethod
    def from_settings(cls, settings: dict, rounds: int) -> RoundsConfig:
        """The config of R rounds whose `settings()` these are (a rounds.json, a scheduled run's parameters)."""
        from pydantic import TypeAdapter

        from tokencredit.pipeline.train.trainer import TrainConfig

        return cls(annotate=TypeAdapter(AnnotateConfig).validate_python(settings["annotate"]),
                   train=TrainConfig(data="", out="", **settings["train"]), rounds=rounds,
                   dev_split=settings["dev"]["split"], dev_limit=settings["dev"]["limit"],
                   first_run=settings["round 0"]["run"])


def check_settings(config: RoundsConfig, out: Path) -> None:
    """OUT/rounds.json written on the first run; ValueError (one line naming the first changed setting) when OUT
    holds rounds of other settings."""
    from tokencredit.pipeline.compare.registry import write_json

    path = out / SETTINGS
    now = config.settings()
    if not path.is_file():
        out.mkdir(parents=True, exist_ok=True)
        write_json(path, now)
        return
    saved = json.loads(path.read_text())
    for part in now:
        for key in sorted(set(saved.get(part, {})) | set(now[part])):
            if saved.get(part, {}).get(key) != now[part].get(key):
                raise ValueError(f"{out} holds rounds run with other settings ({part} {key}: "
                                 f"{saved.get(part, {}).get(key)!r}, now {now[part].get(key)!r}); rerun with those "
                                 "settings, or use a new --out")


def round_folder(out: Path, r: int) -> Path:
    """OUT/round-NNN, refused (ValueError) where a symbolic link leads it outside OUT."""
    return inside(out, out / f"round-{r:03d}")


def run_of(config: RoundsConfig, out: Path, r: int) -> Path:
    """Round r's annotate run: OUT/round-r/run, or round 0's shared `first_run`."""
    return Path(config.first_run) if r == 0 and config.first_run else round_folder(out, r) / "run"


def finished(config: RoundsConfig, out: Path, r: int) -> bool:
    """Whether round r is finished: its dev.json written, or without dev prompts its policy (or its checkpoint's
    untrained.json, or PRUNED: its policy deleted once a later round's was written)."""
    folder = round_folder(out, r)
    if config.dev_split is not None:
        return (folder / "dev.json").is_file()
    return any((folder / name).exists() for name in ("policy", PRUNED, f"checkpoint/{UNTRAINED}"))


def policy_after(config: RoundsConfig, out: Path, r: int) -> str | None:
    """The policy round r leaves (r = -1: the start policy): its merged policy folder, or, where it trained nothing,
    the policy it started from."""
    while r >= 0:
        folder = round_folder(out, r)
        if (folder / PRUNED).is_file():  # checked first: a deletion cut short leaves part of the folder
            raise ValueError(f"{folder / 'policy'} was deleted once a later round's policy was written, and is needed "
                             f"again; delete {folder} and the rounds after it to train them again")
        if (folder / "policy").is_dir():
            return str(folder / "policy")
        r -= 1
    return config.annotate.model


def prune_policies(out: Path, r: int) -> None:
    """Once round r has written its merged policy, delete the earlier rounds' (each about the size of the model in
    float32; no later round samples or trains from them): each folder keeps its checkpoint (LoRA: the adapter) and
    gets PRUNED, written before the deletion so that a kill during it resumes it. Nothing where round r trained
    nothing (an earlier round's policy is still the current one)."""
    import shutil

    from tokencredit.pipeline.compare.registry import now, write_json

    if not (round_folder(out, r) / "policy").is_dir():
        return
    for q in range(r):
        folder = round_folder(out, q)
        if (folder / "policy").is_dir() and not (folder / PRUNED).is_file():
            write_json(folder / PRUNED, {"replaced_by": f"round-{r:03d}", "at": now()})
        shutil.rmtree(folder / "policy", ignore_errors=True)


def annotate_config(config: RoundsConfig, out: Path, r: int) -> AnnotateConfig:
    """Round r's annotate config: the start's, sampled from the policy round r - 1 left with seed + r."""
    sampling = dataclasses.replace(config.annotate.sampling, seed=config.annotate.sampling.seed + r)
    return dataclasses.replace(config.annotate, model=policy_after(config, out, r - 1), sampling=sampling)


def train_round(config: RoundsConfig, out: Path, r: int):
    """Round r's training on its run, from the policy it sampled with: the merged policy in OUT/round-r/policy and
    the checkpoint train wrote, or (None, None) where the run had nothing to train on."""
    folder = round_folder(out, r)
    start = policy_after(config, out, r - 1)
    train = dataclasses.replace(config.train, data=str(run_of(config, out, r)), out=str(folder / "checkpoint"),
                                model=start, seed=config.train.seed + r)
    final = train_or_base(train, f"round {r}", log)
    if final is None:
        return None
    if not (folder / "policy").is_dir():
        save_policy(load_merged(start, final, config.annotate.device), folder / "policy")
    return folder / "policy"


def dev_records(config: RoundsConfig):
    """The dev prompts: `dev_split` of the prompt file, `dev_limit` per task; ValueError where there is none."""
    from tokencredit.pipeline.annotate import load_prompt_set

    records, _ = load_prompt_set(dataclasses.replace(config.annotate, split=config.dev_split,
                                                     limit=config.dev_limit))
    if not records:
        raise ValueError(f"--dev-split {config.dev_split}: no record of that split in {config.annotate.prompts}")
    return records


def score_dev(config: RoundsConfig, policy: str | None, records, path: Path, label: str) -> dict:
    """PATH (dev.json): the greedy decode of each dev prompt by `policy`, its reward (`decode_rewards`), their mean
    `reward`; read back where it is there."""
    from tokencredit.pipeline.compare.registry import write_json
    from tokencredit.pipeline.sample import make_sampler, release_sampler

    if path.is_file():
        return json.loads(path.read_text())
    annotate = config.annotate
    # the run's engine settings: a dev reward decoded in another dtype than the round sampled in is not its policy's
    sampler = make_sampler(annotate.backend, policy, device=annotate.device, dtype=annotate.dtype,
                           threads=annotate.cpu_threads)
    dtype = getattr(sampler, "dtype", "float32")  # the transformers backend samples in float32 only
    greedy = SamplingConfig(n=1, temperature=0.0, seed=annotate.sampling.seed,
                            max_new_tokens=annotate.sampling.max_new_tokens)
    start = time.perf_counter()
    decodes, tokens = decode_rewards(sampler, records, [("greedy", greedy)], annotate.verifiers)
    release_sampler(sampler)
    result = {"round": label, "policy": policy, "reward": mean_reward(decodes), "prompts": len(records),
              "decode": "greedy", "dtype": dtype, "tokens": tokens, "seconds": round(time.perf_counter() - start, 2),
              "rewards": {i: cell["reward"] for i, cell in decodes["greedy"].items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, result)
    return result


def summary(out: Path) -> list[dict]:
    """Per scored policy (the start, then each finished round): its label and dev reward, from the dev.json files."""
    paths = [out / "start" / "dev.json", *sorted(out.glob("round-*/dev.json"))]
    return [{"round": d["round"], "reward": d["reward"], "prompts": d["prompts"]}
            for d in (json.loads(p.read_text()) for p in paths if p.is_file())]
