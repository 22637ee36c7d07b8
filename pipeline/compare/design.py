"""The design file of `tokencredit compare` (TOML): what is trained, how, and what is compared.

    [policy]    model (registry name or folder; omitted: the shipped tiny policy), device, backend
    [prompts]   file (any prompt file annotate reads; relative to the design file's folder), format, train_split, heldout_split, train_limit,
                heldout_limit, verifier (plugin verifiers, as annotate's --verifier), dev_limit (dev prompts per task:
                the train split's records after the first train_limit, which no pool samples; default DEV_LIMIT)
    [pools.NAME]  n or tree (R,L), temperature, top_p, max_new_tokens, seed, credit (kinds), locate, branch
    [arms.NAME]   pool, advantage (anything `train --advantage` takes, a mix too), objective (pg | sft | rs)
    [training]  seeds, steps, batch_size, lr, lora, rounds (each arm's rounds of annotate -> train; default 1)
    [scoring]   greedy (bool), sampled (decodes per prompt), temperature, seed, max_new_tokens, batch_size
    [analysis]  comparisons ([[arm, baseline], ...]; default every arm against the first), primary
    [targets]   mde (the detectable difference the design is sized for), engine_tokens_per_s (optional)

Every unknown key or bad value is one ValueError naming the table and key.
"""
from __future__ import annotations

import hashlib
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tokencredit.pipeline.config import check_lr
from tokencredit.pipeline.names import check_name

OBJECTIVES = ("pg", "sft", "rs")
BACKENDS = ("auto", "transformers", "vllm")
SECTIONS = {
    "policy": {"model", "device", "backend"},
    "prompts": {"file", "format", "train_split", "heldout_split", "train_limit", "heldout_limit", "verifier",
                "dev_limit"},
    "training": {"seeds", "steps", "batch_size", "lr", "lora", "rounds"},
    "scoring": {"greedy", "sampled", "temperature", "seed", "max_new_tokens", "batch_size"},
    "analysis": {"comparisons", "primary"},
    "targets": {"mde", "engine_tokens_per_s"},
}
POOL_KEYS = {"n", "tree", "temperature", "top_p", "max_new_tokens", "seed", "credit", "locate", "branch",
             "shard_size"}
ARM_KEYS = {"pool", "advantage", "objective"}
DEV_LIMIT = 64  # dev prompts per task where the design names none (fewer where the train split has fewer left)


@dataclass(frozen=True)
class Pool:
    name: str
    n: int | None = 8
    tree: tuple[int, ...] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 96
    seed: int = 0
    credit: tuple[str, ...] = ("gdpo",)
    locate: str = "replay"
    branch: str | None = None
    shard_size: int = 16

    def sampling(self):
        """The annotate stage's SamplingConfig of this pool (ValueError on a value it refuses)."""
        from tokencredit.pipeline.config import SamplingConfig

        return SamplingConfig(n=self.n, tree=self.tree, max_new_tokens=self.max_new_tokens,
                              temperature=self.temperature, top_p=self.top_p, seed=self.seed,
                              **({"branch": self.branch} if self.branch else {}))

    def credit_config(self):
        """The annotate stage's CreditConfig of this pool (ValueError on a value it refuses)."""
        from tokencredit.pipeline.config import CreditConfig

        return CreditConfig(kinds=self.credit, locate=self.locate)


@dataclass(frozen=True)
class Arm:
    name: str
    pool: str
    advantage: str | None = "gdpo"
    objective: str = "pg"


@dataclass(frozen=True)
class Design:
    path: str
    sha256: str
    policy: dict
    prompts: dict
    pools: dict[str, Pool]
    arms: dict[str, Arm]
    training: dict
    scoring: dict
    comparisons: tuple[tuple[str, str], ...]
    primary: tuple[tuple[str, str], ...]
    targets: dict = field(default_factory=dict)

    @property
    def seeds(self) -> list[int]:
        return list(self.training["seeds"])

    @property
    def rounds(self) -> int:
        """[training] rounds; absent: 1, and the design's content stays what it was before rounds existed."""
        return self.training.get("rounds", 1)

    @property
    def dev_limit(self) -> int:
        """[prompts] dev_limit; absent: DEV_LIMIT, and the design's content stays what it was before dev prompts
        existed (a folder registered then accepts it)."""
        return self.prompts.get("dev_limit", DEV_LIMIT)

    @property
    def decodes(self) -> list[str]:
        """Decode names in scoring order: 'greedy' then 'sampled-1' ... ."""
        return (["greedy"] if self.scoring["greedy"] else []) + [f"sampled-{k + 1}"
                                                                 for k in range(self.scoring["sampled"])]


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _check_keys(where: str, table: dict, allowed: set[str]) -> None:
    if not isinstance(table, dict):
        raise ValueError(f"design [{where}]: {table!r}; expected a table")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ValueError(f"design [{where}]: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}")


def _check_types(where: str, table: dict, types: dict) -> None:
    """ValueError naming the table and key of a value of the wrong type (bools are not numbers here)."""
    for key, kind in types.items():
        if key not in table:
            continue
        value = table[key]
        if kind == "seeds":
            good = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                   for v in value)
        elif kind is bool:
            good = isinstance(value, bool)
        elif kind in (int, "positive"):
            good = isinstance(value, int) and not isinstance(value, bool) and value >= (1 if kind == "positive" else 0)
        else:  # TOML has inf and nan
            good = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf
        if not good:
            expected = {"seeds": "a list of integers >= 0", bool: "true or false", int: "an integer >= 0",
                        "positive": "an integer >= 1", float: "a finite number > 0"}[kind]
            raise ValueError(f"design [{where}] {key}: {value!r}; expected {expected}")


def _pairs(where: str, value, arms: dict) -> tuple[tuple[str, str], ...]:
    pairs = []
    for pair in value:
        if not (isinstance(pair, list) and len(pair) == 2 and all(a in arms for a in pair) and pair[0] != pair[1]):
            raise ValueError(f"design [analysis] {where}: {pair!r} is not [arm, baseline] of two arms "
                             f"({', '.join(arms)})")
        pairs.append((pair[0], pair[1]))
    return tuple(pairs)


def _pool(name: str, table: dict) -> Pool:
    """[pools.NAME] as a Pool whose sampling and credit settings the annotate stage accepts."""
    check_name(name, "design [pools] name")  # it names DIR/pools/NAME, the folder its annotate run writes
    _check_keys(f"pools.{name}", table, POOL_KEYS)
    _check_types(f"pools.{name}", table, {"n": int, "temperature": float, "top_p": float, "max_new_tokens": int,
                                          "seed": int, "shard_size": int})
    for key, kind in (("tree", int), ("credit", str)):
        value = table.get(key, [])
        if not (isinstance(value, list) and all(isinstance(v, kind) and not isinstance(v, bool) for v in value)):
            raise ValueError(f"design [pools.{name}] {key}: {value!r}; expected a list of "
                             f"{'integers' if kind is int else 'strings'}")
    for key in ("locate", "branch"):
        if key in table and not isinstance(table[key], str):
            raise ValueError(f"design [pools.{name}] {key}: {table[key]!r}; expected a string")
    tree = tuple(table["tree"]) if "tree" in table else None
    credit = tuple(table.get("credit", ["gdpo"]))
    pool = Pool(name=name, n=None if tree else int(table.get("n", 8)), tree=tree,
                temperature=float(table.get("temperature", 1.0)), top_p=float(table.get("top_p", 1.0)),
                max_new_tokens=int(table.get("max_new_tokens", 96)), seed=int(table.get("seed", 0)),
                credit=credit if "gdpo" in credit else ("gdpo", *credit), locate=table.get("locate", "replay"),
                branch=table.get("branch"), shard_size=int(table.get("shard_size", 16)))
    try:  # refused here, before any stage starts, not when its pool comes to be annotated
        pool.sampling(), pool.credit_config()
    except ValueError as error:
        raise ValueError(f"design [pools.{name}]: {error}") from None
    return pool


def _advantage(arm: str, value) -> str:
    """An arm's advantage once `train --advantage` would take it; else ValueError naming the arm."""
    from tokencredit.pipeline.dataset.training import parse_advantage

    try:
        if not isinstance(value, str):
            raise ValueError("expected a string such as 'gdpo' or 'mrtpo:0.5,gdpo:0.5'")
        parse_advantage(value)
    except ValueError as error:
        raise ValueError(f"design [arms.{arm}] advantage: {value!r}: {error}") from None
    return value


def load_design(path: str | Path) -> Design:
    """Parse and check a design file; ValueError (one line, naming the table and key) on a bad one."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"design {path}: not TOML: {error}") from None
    _check_keys("top level", raw, {*SECTIONS, "pools", "arms"})
    for section, allowed in SECTIONS.items():
        _check_keys(section, raw.get(section, {}), allowed)
    _check_types("training", raw.get("training", {}), {"seeds": "seeds", "steps": int, "batch_size": int,
                                                       "lr": float, "lora": bool, "rounds": "positive"})
    _check_types("scoring", raw.get("scoring", {}), {"greedy": bool, "sampled": int, "temperature": float,
                                                     "seed": int, "max_new_tokens": int, "batch_size": int})
    _check_types("prompts", raw.get("prompts", {}), {"dev_limit": "positive"})
    _check_types("targets", raw.get("targets", {}), {"mde": float, "engine_tokens_per_s": float})
    # the sampling engine of the pools and of scoring; "auto" (annotate's default): the vllm engine where it is
    # installed for the device and a stage samples enough tokens for its start to pay (run.stage_backend)
    policy = {"model": None, "device": "cpu", "backend": "auto", **raw.get("policy", {})}
    if policy["backend"] not in BACKENDS:
        raise ValueError(f"design [policy] backend: {policy['backend']!r}; choose from {', '.join(BACKENDS)}")
    prompts = {"format": "native", "train_split": "train", "heldout_split": "test", "train_limit": None,
               "heldout_limit": None, "verifier": [], **raw.get("prompts", {})}
    if "file" not in prompts:
        raise ValueError("design [prompts]: 'file' is required (a prompt file or folder annotate reads)")
    if prompts["file"] != "demo" and not Path(prompts["file"]).is_absolute():  # relative to the design file
        prompts["file"] = str((path.parent / prompts["file"]).resolve())
    pools = {name: _pool(name, table) for name, table in raw.get("pools", {}).items()}
    if not pools:
        raise ValueError("design: no [pools.NAME] table (the annotated samples the arms train on)")
    arms = {}
    for name, table in raw.get("arms", {}).items():
        check_name(name, "design [arms] name")  # it names DIR/train/ARM-SEED, which a rerun deletes and writes
        _check_keys(f"arms.{name}", table, ARM_KEYS)
        if table.get("pool") not in pools:
            raise ValueError(f"design [arms.{name}] pool: {table.get('pool')!r} is not one of the pools "
                             f"({', '.join(pools)})")
        objective = table.get("objective", "pg")
        if objective not in OBJECTIVES:
            raise ValueError(f"design [arms.{name}] objective: {objective!r}; choose from {', '.join(OBJECTIVES)}")
        if "-" in name:
            raise ValueError(f"design [arms.{name}]: an arm's name has no '-' (it names files as ARM-SEED)")
        advantage = None if objective == "rs" else _advantage(name, table.get("advantage", "gdpo"))
        arms[name] = Arm(name=name, pool=table["pool"], objective=objective, advantage=advantage)
    if len(arms) < 2:
        raise ValueError("design: at least two [arms.NAME] tables are needed to compare")
    training = {"seeds": [0, 1], "steps": 16, "batch_size": 8, "lr": 3e-4, "lora": True, **raw.get("training", {})}
    check_lr(training["lr"], "design [training] lr")  # `lr = inf` trained NaN policies that were then reported
    if len(training["seeds"]) < 2 or len(set(training["seeds"])) != len(training["seeds"]):
        raise ValueError(f"design [training] seeds: {training['seeds']!r}; at least two distinct seeds (the "
                         "seed component needs them)")
    scoring = {"greedy": True, "sampled": 0, "temperature": 1.0, "seed": 12345, "max_new_tokens": 96,
               "batch_size": 64, **raw.get("scoring", {})}
    if not scoring["greedy"] and scoring["sampled"] < 1:
        raise ValueError("design [scoring]: no decode (greedy = false and sampled = 0)")
    analysis = raw.get("analysis", {})
    first = next(iter(arms))
    comparisons = _pairs("comparisons", analysis.get("comparisons", [[a, first] for a in arms if a != first]), arms)
    primary = _pairs("primary", analysis.get("primary", []), arms)
    return Design(path=str(path), sha256=file_sha256(path), policy=policy, prompts=prompts, pools=pools, arms=arms,
                  training=training, scoring=scoring, comparisons=comparisons, primary=primary,
                  targets=raw.get("targets", {}))


def without_arms(design: Design, arms: set[str]) -> dict:
    """The design's content less `arms` and the comparisons naming them: what an amendment that only adds
    arms leaves unchanged (compared with the registered design's)."""
    return {"policy": design.policy, "prompts": design.prompts,
            "pools": {k: vars(v) for k, v in design.pools.items()},
            "arms": {k: vars(v) for k, v in design.arms.items() if k not in arms},
            "training": design.training, "scoring": design.scoring,
            "comparisons": [list(p) for p in design.comparisons if not set(p) & arms],
            "primary": [list(p) for p in design.primary if not set(p) & arms], "targets": design.targets}
