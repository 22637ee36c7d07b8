"""The stages of `tokencredit compare` (wired by tokencredit.flows.compare): a pool's annotate config, the
training of each (arm, seed), the scoring of every policy.

    DIR/registration.json      the design's hash and commit (registry), written before anything else
    DIR/pools/NAME/            an annotate run (the product's, resumable shard by shard)
    DIR/train/ARM-SEED/final   a train checkpoint (LoRA adapter)
    DIR/train/ARM-SEED/round-NNN/{run,checkpoint,policy}   with [training] rounds > 1: the arm's rounds
                               (tokencredit.pipeline.rounds; round 0 trains on the pool, round-000/ has no run); a
                               round's merged policy is deleted once the next round has written its own
    DIR/scores/LABEL.json      one policy's rewards per held-out prompt and decode (LABEL: start or ARM-SEED)
    DIR/scores/dev/start.json, DIR/scores/dev/ARM-SEED/round-NNN.json   the greedy reward per dev prompt of the
                               start policy and of each (arm, seed)'s policy after each round (`dev_records`)

Each stage's output is written atomically as it finishes and a re-run skips what is there, so a run killed at any
point (kill -9 included) resumes with the same rows: an annotate run resumes by shard; a training cut short is
started again from its seed (no checkpoint is kept mid-run, so the resumed arm is the uninterrupted one); a policy
is scored whole or not at all.
"""
from __future__ import annotations

import dataclasses
import json
import math
import shutil
import statistics
import time
from pathlib import Path

from tokencredit.pipeline.compare.design import Arm, Design, Pool
from tokencredit.pipeline.compare.registry import now, write_json
from tokencredit.pipeline.names import inside
from tokencredit.pipeline.scoring import UNTRAINED, decode_rewards, load_merged, save_policy, train_or_base


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] compare: {message}", flush=True)


def stage_backend(design: Design, planned_tokens: int) -> str:
    """The design's sampling backend for a stage sampling `planned_tokens`; "auto" as annotate's: the vllm engine
    where it is installed for the device and the stage is long enough for its start to pay, else transformers."""
    if design.policy["backend"] != "auto":
        return design.policy["backend"]
    from tokencredit.pipeline.sample.choice import choose_backend

    backend, why = choose_backend(design.policy["device"], planned_tokens)
    log(f"backend auto: {backend} ({why})")
    return backend


def annotate_config(design: Design, pool: Pool | None, split: str, limit: int | None, backend: str = "transformers"):
    """The annotate stage's config of a pool (or, with pool None, of the held-out prompt set)."""
    from tokencredit.pipeline.config import AnnotateConfig, CreditConfig, SamplingConfig
    from tokencredit.verifiers.plugins import resolve

    return AnnotateConfig(prompts=design.prompts["file"], format=design.prompts["format"],
                          verifiers=resolve(design.prompts["verifier"]), split=split, limit=limit,
                          backend=backend, model=design.policy["model"],
                          device=design.policy["device"], shard_size=pool.shard_size if pool else 16,
                          sampling=pool.sampling() if pool else SamplingConfig(
                              max_new_tokens=design.scoring["max_new_tokens"]),
                          credit=pool.credit_config() if pool else CreditConfig(kinds=("gdpo",), locate="replay"))


def design_inputs(design: Design) -> dict[str, dict]:
    """Every input the design names, by content: {path: {"size", "sha256"}} of each file its stages read (the prompt
    file, its records' databases, the policy's files and, with P2T, the reward model's: identity.input_files), and
    {"plugin TARGET": {"sha256"}} of each plugin verifier's source. What the registration records. Building every
    stage's config here refuses a value the annotate stage would refuse, before any stage starts."""
    from tokencredit.pipeline.annotate import load_prompt_set
    from tokencredit.pipeline.identity import file_checksums, input_files

    used = {arm.pool for arm in design.arms.values()}
    configs = [annotate_config(design, pool, design.prompts["train_split"], design.prompts["train_limit"])
               for name, pool in design.pools.items() if name in used]
    configs.append(annotate_config(design, None, design.prompts["heldout_split"], design.prompts["heldout_limit"]))
    files = {path for config in configs for path in input_files(config, load_prompt_set(config)[0])}
    inputs = file_checksums(sorted(files))
    inputs.update({f"plugin {ref.target}": {"sha256": ref.source_sha256} for ref in configs[-1].verifiers})
    return inputs


def within(out: Path, *parts: str) -> Path:
    """DIR/parts, where a stage writes or deletes: refused (ValueError) where a symbolic link in DIR leads it
    outside DIR."""
    return inside(out, out.joinpath(*parts))


def pool_folder(out: Path, pool: Pool) -> Path:
    return within(out, "pools", pool.name)


def pool_complete(folder: Path) -> bool:
    """Whether the pool's annotate run has finished (a complete run is kept whatever wrote it)."""
    manifest = folder / "manifest.json"
    return manifest.is_file() and bool(json.loads(manifest.read_text()).get("complete"))


def train_arm(design: Design, arm: Arm, seed: int, pool: Path, out: Path) -> Path | None:
    """DIR/train/ARM-SEED/final, trained from the base policy; None where the pool has nothing this arm trains
    on (rejection sampling with no response passing every reward, SFT with no positive weight): the policy stays
    the base, as a round that accepts nothing, and DIR/train/ARM-SEED/untrained.json says why (`train_or_base`)."""
    from tokencredit.pipeline.train.trainer import TrainConfig

    folder = within(out, "train", f"{arm.name}-{seed}")
    if not ((folder / "final").is_dir() or (folder / UNTRAINED).is_file()):
        shutil.rmtree(folder, ignore_errors=True)  # a training cut short starts again: the same seed, the same arm
        log(f"train {arm.name} seed {seed}")
    return train_or_base(arm_train_config(design, arm, seed, pool, folder), f"{arm.name}-{seed}", log)


def arm_train_config(design: Design, arm: Arm, seed: int, data: Path, folder: Path):
    """The TrainConfig of (arm, seed) on the run `data` into `folder`, from the base policy (a round sets its own)."""
    from tokencredit.pipeline.train.trainer import TrainConfig

    steps = design.training["steps"]
    return TrainConfig(data=str(data), out=str(folder), advantage=arm.advantage, objective=arm.objective,
                       model=design.policy["model"], steps=steps, batch_size=design.training["batch_size"],
                       lr=design.training["lr"], seed=seed, device=design.policy["device"],
                       lora=design.training["lora"], save_every=steps)


def rounds_config(design: Design, arm: Arm, seed: int, pool: Path, out: Path):
    """(arm, seed)'s rounds (`[training] rounds`, tokencredit.pipeline.rounds) in DIR/train/ARM-SEED: round 0 trains
    on the shared pool, each later round annotates the arm's pool settings from the arm's policy (with the credit
    the arm trains on alone, `arm_credit`) and trains on it; no dev prompts of the rounds' own (compare scores each
    round's policy on the design's, `dev_records`; the last round's on the held-out ones too)."""
    from tokencredit.pipeline.rounds import RoundsConfig

    folder = within(out, "train", f"{arm.name}-{seed}")
    return RoundsConfig(annotate=arm_credit(arm, pool_config(design, design.pools[arm.pool])), rounds=design.rounds,
                        train=arm_train_config(design, arm, seed, pool, folder), dev_split=None,
                        first_run=str(pool)), folder


def arm_credit(arm: Arm, config):
    """`config` (a pool's annotate config) computing only the credit `arm` trains on: GDPO's, and its advantage's
    where that is another kind. A round's pool is the arm's own: the pool's other credits (an MRTPO replay, for
    a GDPO arm) would cost hours and train nothing."""
    kinds = tuple(k for k in config.credit.kinds if k in ("gdpo", arm.advantage))
    return dataclasses.replace(config, credit=dataclasses.replace(config.credit, kinds=kinds))


def pool_config(design: Design, pool: Pool):
    """The annotate config of a pool on the train prompts, with the backend `stage_backend` picks for its size."""
    from tokencredit.pipeline.annotate import load_prompt_set

    config = annotate_config(design, pool, design.prompts["train_split"], design.prompts["train_limit"])
    planned = len(load_prompt_set(config)[0]) * (pool.n or math.prod(pool.tree)) * pool.max_new_tokens
    return dataclasses.replace(config, backend=stage_backend(design, planned))


def heldout_records(design: Design):
    """The held-out prompt set (records the product's loader accepts; rejected ones are not scored)."""
    from tokencredit.pipeline.annotate import load_prompt_set

    records, _ = load_prompt_set(annotate_config(design, None, design.prompts["heldout_split"],
                                                 design.prompts["heldout_limit"]))
    if not records:
        raise ValueError(f"design [prompts]: no held-out record of split {design.prompts['heldout_split']!r} in "
                         f"{design.prompts['file']}")
    return records


def dev_records(design: Design) -> list:
    """The dev prompts: per task, the train split's records after the first [prompts] train_limit (none of them in
    a pool), at most `design.dev_limit`; none where train_limit is unset (every train record is in the pools) or
    the held-out split is the train split. A design naming dev_limit where there is no such record is refused
    (ValueError). The held-out split is not read."""
    from tokencredit.pipeline.annotate import load_prompt_set

    prompts = design.prompts
    train, limit = prompts["train_split"], prompts["train_limit"]
    if limit is None or prompts["heldout_split"] == train:
        chosen = []
    else:
        records, _ = load_prompt_set(annotate_config(design, None, train, None))
        pooled = {r.id for pool in {arm.pool for arm in design.arms.values()}  # a pool rejects by its own lengths
                  for r in load_prompt_set(annotate_config(design, design.pools[pool], train, limit))[0]}
        seen: dict[str, int] = {}
        chosen = []
        for record in records:
            seen[record.task] = seen.get(record.task, 0) + 1
            if limit < seen[record.task] <= limit + design.dev_limit and record.id not in pooled:
                chosen.append(record)
    if not chosen and "dev_limit" in prompts:
        raise ValueError(f"design [prompts] dev_limit: {prompts['dev_limit']}; the train split {train!r} of "
                         f"{prompts['file']} has no record after the first train_limit = {limit} per task to keep "
                         "as dev prompts")
    return chosen


def refuse_non_finite_weights(model, label: str, adapter: Path | None) -> None:
    """ValueError (one line) when a weight of the policy to score is NaN or infinite: such a policy failed, and its
    rewards (a NaN model decodes something all the same) must not become a row of the comparison."""
    import torch

    weights = dict(model.named_parameters())  # a tied weight once
    bad = [name for name, tensor in weights.items() if not bool(torch.isfinite(tensor).all())]
    if bad:
        remedy = f"delete {adapter} and rerun to train it again" if adapter else "check the design's [policy] model"
        raise ValueError(f"policy {label} ({adapter or 'the base policy'}): {len(bad)} of "
                         f"{len(weights)} weight tensors hold NaN or inf (first {bad[0]}); it failed and "
                         f"is not scored; {remedy}")


def training_seconds(train: Path) -> list[Path]:
    """DIR/train's seconds.json of each training: of each (arm, seed), or of each round of one."""
    return sorted([*train.glob("*/seconds.json"), *train.glob("*/round-*/checkpoint/seconds.json")])


def scores_path(out: Path, label: str) -> Path:
    return within(out, "scores", f"{label}.json")


def dev_label(arm: str, seed: int, r: int) -> str:
    """(arm, seed)'s policy after round r (0: the first) among the dev scores: ARM-SEED/round-NNN."""
    return f"{arm}-{seed}/round-{r:03d}"


def dev_path(out: Path, label: str) -> Path:
    """DIR/scores/dev/LABEL.json (LABEL: start or `dev_label`'s)."""
    return within(out, "scores", "dev", f"{label}.json")


def status(design: Design, out: Path) -> list[str]:
    """What DIR holds and the hours its run has left at the pace it measured, read without a reward (a look at a
    running experiment that does not peek at its result): lines to print."""
    if not (out / "registration.json").is_file():
        return [f"{out}: not started (no registration.json)"]
    registration = json.loads((out / "registration.json").read_text())
    commit = registration["design_commit"][:12] if registration["design_commit"] else "none: not pre-registered"
    lines = [f"{out}: registered {registration['registered_at']} under design {registration['design_hash'][:12]} "
             f"(commit {commit})"]
    used = [name for name in design.pools if any(arm.pool == name for arm in design.arms.values())]
    lines.append("pools: " + ", ".join(
        f"{name} {'complete' if pool_complete(pool_folder(out, design.pools[name])) else 'not complete'}"
        for name in used))
    from tokencredit.pipeline.dataset.writer import stage_seconds
    from tokencredit.pipeline.timing import describe

    for name in used:  # where each pool's annotate run spent its time (the manifest's, or its shards' so far)
        times = stage_seconds(str(pool_folder(out, design.pools[name])))
        if any(times):
            lines.append(f"pool {name}: {describe(*times)}")
    labels = ["start"] + [f"{arm.name}-{seed}" for seed in design.seeds for arm in design.arms.values()]
    done = [label for label in labels if scores_path(out, label).is_file()]
    left = len(labels) - len(done)
    lines.append(f"policies scored: {len(done)} of {len(labels)}"
                 + (f"; next: {next(x for x in labels if x not in done)}" if left else "; complete"))
    dev = (out / "scores" / "dev")
    if dev.is_dir():  # counted, not read
        points = 1 + len(labels[1:]) * design.rounds
        lines.append(f"dev points scored: {len(list(dev.glob('*.json'))) + len(list(dev.glob('*/round-*.json')))} of "
                     f"{points} (the start, and each arm and seed after each round)")
    costs = [policy_seconds(out, label) for label in done if label != "start"]
    if left and costs:
        median = {stage: statistics.median(c[stage] for c in costs) for stage in costs[0]}
        policies = "policy" if left == 1 else "policies"
        lines.append(f"about {left * sum(median.values()) / 3600:.1f} h left: {left} {policies} x ("
                     + " + ".join(f"{s:.0f} s {stage}" for stage, s in median.items() if s)
                     + f"; the medians of the {len(costs)} finished here)")
    return lines


def policy_seconds(out: Path, label: str) -> dict[str, float]:
    """The seconds a finished (arm, seed), LABEL, took in DIR by stage, as each stage recorded them: held-out scoring,
    training (each round's), the later rounds' annotate runs, dev scoring."""
    from tokencredit.pipeline.dataset.writer import stage_seconds

    folder = out / "train" / label

    def total(paths) -> float:
        return sum(json.loads(p.read_text())["seconds"] for p in paths if p.is_file())

    return {"scoring": total([scores_path(out, label)]),
            "training": total([folder / "seconds.json", *folder.glob("round-*/checkpoint/seconds.json")]),
            "later rounds' sampling": sum(stage_seconds(str(run))[0].get("total", 0.0)
                                          for run in folder.glob("round-*/run")),
            "dev scoring": total((out / "scores" / "dev" / label).glob("*.json"))}


def score_policy(design: Design, label: str, adapter: Path | None, records, out: Path,
                 arm: str | None = None, seed: int | None = None, dev_round: int | None = None) -> dict:
    """DIR/scores/LABEL.json: per held-out prompt and decode, the mean of its rewards and each reward's score;
    the tokens and seconds the decodes took (the engine's measured speed, which `--plan` reads). With `dev_round`
    (the start policy: -1), `records` are the dev prompts, decoded greedily alone, into `dev_path`; `adapter` a
    train checkpoint or a round's merged policy folder."""
    from tokencredit.pipeline.config import SamplingConfig
    from tokencredit.pipeline.sample import make_sampler, release_sampler
    from tokencredit.verifiers.plugins import resolve

    path = scores_path(out, label) if dev_round is None else dev_path(out, label)
    if path.is_file():
        return json.loads(path.read_text())
    log(f"score {label}" + (" on the dev prompts" if dev_round is not None else ""))
    scoring, refs = design.scoring, resolve(design.prompts["verifier"])
    runs = ([("greedy", SamplingConfig(n=1, temperature=0.0, seed=scoring["seed"],
                                       max_new_tokens=scoring["max_new_tokens"], batch_size=scoring["batch_size"]))]
            if scoring["greedy"] or dev_round is not None else [])
    if scoring["sampled"] and dev_round is None:
        runs.append(("sampled", SamplingConfig(n=scoring["sampled"], temperature=scoring["temperature"],
                                               seed=scoring["seed"], max_new_tokens=scoring["max_new_tokens"],
                                               batch_size=scoring["batch_size"])))
    backend = stage_backend(design, len(records) * sum(c.n for _, c in runs) * scoring["max_new_tokens"])
    policy = load_merged(design.policy["model"], adapter, design.policy["device"])
    refuse_non_finite_weights(policy[0], label, adapter)
    temporary = within(out, "policies", label.replace("/", "-") + ("-dev" if dev_round is not None else ""))
    if backend == "transformers":
        sampler = make_sampler(backend, design.policy["model"], device=design.policy["device"], policy=policy)
    elif adapter is not None and not (adapter / "adapter_config.json").is_file():  # a round's merged policy
        sampler = make_sampler(backend, str(adapter), device=design.policy["device"])
    else:  # an engine that loads its own weights: the merged policy in DIR/policies/LABEL until it is scored
        if not temporary.is_dir():
            save_policy(policy, temporary)
        sampler = make_sampler(backend, str(temporary), device=design.policy["device"])
    start = time.perf_counter()
    decodes, tokens = decode_rewards(sampler, records, runs, refs)
    release_sampler(sampler)  # an engine holds its policy's weights and KV cache: the next policy loads its own
    result = {"label": label, "arm": arm, "seed": seed, **({} if dev_round is None else {"round": dev_round + 1}),
              "scored_at": now(), "backend": backend, "seconds": round(time.perf_counter() - start, 2),
              "tokens": tokens, "decodes": decodes}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, result)
    shutil.rmtree(temporary, ignore_errors=True)  # a merged copy for the engine: scored, not needed
    return result
