"""The settings that determine a dataset: sampling, GDPO, credit, and the annotate run that holds them.

Plain dataclasses and option names with no heavy imports, so that the command line can show their
defaults in `--help` without loading torch or transformers. (credit.advantages, credit.relevance
and credit.assign re-export the names they used to define.)
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokencredit.verifiers.plugins import PluginRef

from tokencredit.pipeline.models.registry import MODELS

# What the replay shows for a reward (sample/prompts.py lays it out) and what it does with the one it leaves out
FEEDBACK_STYLES = ("expected", "expected+observed", "auto")
ABLATIONS = ("drop", "null")


FLAT_N = 4  # responses per prompt of flat sampling unless `n` says otherwise
# Where a tree's inner node ends (sample/tree.py). Measured with SmolLM2-135M-Instruct on demo prompts, 4 x 4
# trees (bench/bench_tree.py --quick, now in bench_sampling.py: 4 prompts, 32 tokens; tree.json `branch_stats`):
# fraction:0.25 branched every root, at 27% of the leaf, and every set of siblings differed; sentence branched
# 75% of roots, late (70% of the leaf: SQL and tool calls have no early sentence end); entropy:0.1 branched 88%
# at 38%. An early, always-taken branch point is also where the Monte-Carlo credit experiment found failures
# decided (the pass rate falls most within the first quarter of the response).
DEFAULT_BRANCH = "fraction:0.25"


def parse_branch(text: str) -> tuple[str, float | None]:
    """'sentence' -> ('sentence', None); 'fraction:0.25' -> ('fraction', 0.25); 'entropy:0.1' -> ('entropy', 0.1).
    ValueError naming the option for anything else (fraction in [0, 1), entropy's quantile in (0, 1])."""
    kind, _, value = text.partition(":")
    try:
        number = float(value) if value else None
    except ValueError:
        number = float("nan")
    ok = {"sentence": number is None and not value, "fraction": number is not None and 0 <= number < 1,
          "entropy": number is not None and 0 < number <= 1}.get(kind, False)
    if not ok:
        raise ValueError(f"branch {text!r}: expected sentence, fraction:F with 0 <= F < 1 (F of max_new_tokens) "
                         f"or entropy:Q with 0 < Q <= 1 (a token whose entropy is in the top Q of its node's)")
    return kind, number


@dataclass(frozen=True)
class SamplingConfig:
    # responses per prompt; None: FLAT_N, or with `tree` its leaves (an explicit n must equal them)
    n: int | None = None
    max_new_tokens: int = 96
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()  # a response ends at the token that completes one of these strings
    seed: int = 0
    # rows (prompt x sample) per forward; None: the backend's choice from the model's size and the context, never
    # from the memory free at the time (transformers_backend.auto_batch: AUTO_BATCH rows unless a fixed budget
    # holds fewer), so that a run's batches, hence its tokens, follow from its config
    batch_size: int | None = None
    # Tree-sampled groups (method.md 3b): (R, L) or (R, L1, L2) branching per level, R * L leaves per prompt
    # in place of `n` flat samples; None: flat sampling.
    tree: tuple[int, ...] | None = None
    branch: str = DEFAULT_BRANCH  # where a tree's inner node ends (`parse_branch`); unused without `tree`

    def __post_init__(self):
        object.__setattr__(self, "stop", tuple(self.stop))
        if self.tree is not None:
            object.__setattr__(self, "tree", tuple(self.tree))
        tree_ok = self.tree is None or (len(self.tree) in (2, 3) and all(
            isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in self.tree))
        if not tree_ok:
            raise ValueError(f"SamplingConfig: invalid tree={self.tree!r}: expected (R, L) or (R, L1, L2) "
                             f"of integers >= 1 (R roots per prompt, L continuations of each)")
        leaves = self.leaves_per_tree
        if self.n is None:
            object.__setattr__(self, "n", leaves or FLAT_N)
        elif leaves is not None and self.n != leaves:
            raise ValueError(f"SamplingConfig: n={self.n} conflicts with tree={self.tree!r}, whose groups have "
                             f"{leaves} leaves; leave n out (the tree sets it)")
        checks = {"n": isinstance(self.n, int) and self.n >= 1, "max_new_tokens": self.max_new_tokens >= 1,
                  "temperature": self.temperature >= 0, "top_p": 0 < self.top_p <= 1,
                  "batch_size": self.batch_size is None or self.batch_size >= 1, "stop": all(isinstance(s, str) and s for s in self.stop)}
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"SamplingConfig: invalid {', '.join(f'{b}={getattr(self, b)!r}' for b in bad)}")
        kind, _ = parse_branch(self.branch)
        if self.tree is not None and kind == "fraction":
            inner = len(self.tree) - 1  # nodes along a leaf's path that end at a branch point
            if inner * self.branch_tokens >= self.max_new_tokens:
                raise ValueError(f"SamplingConfig: branch {self.branch!r} puts the last branch point at token "
                                 f"{inner * self.branch_tokens}, not before max_new_tokens={self.max_new_tokens}; "
                                 f"use a smaller fraction")

    @property
    def leaves_per_tree(self) -> int | None:
        """R * L (* L2): the responses of one prompt's tree; None for flat sampling."""
        return None if self.tree is None else math.prod(self.tree)

    @property
    def branch_tokens(self) -> int:
        """With `fraction:F`: the tokens of each inner node, int(F * max_new_tokens)."""
        return int(parse_branch(self.branch)[1] * self.max_new_tokens)


EPS = 1e-6
BATCH_STEPS = ("std", "whiten", "none")
SINGLE = ("zero", "raw")


@dataclass(frozen=True)
class GdpoOptions:
    """GDPO's options; the defaults are method.md's.

    Group step: A[i,k] = (r[i,k] - mean_g) / (std_g + eps), std with `ddof`; A = 0 where std_g <=
    `zero_std`. A group with a single valid score in k gets A = 0 (`single="zero"`), or, as verl
    does, mean 0 and std 1: A = r / (1 + eps) (`single="raw"`).
    Batch step over the responses that have a reward: `batch="std"`: c = 1 / (std_b S + batch_eps)
    with `batch_ddof`, m = mean_b S; `batch="whiten"`: verl's `masked_whiten` over tokens, i.e.
    m and the variance weighted by each response's token count and c = 1 / sqrt(var + batch_eps);
    `batch="none"`: c = 1, m = 0.
    """

    ddof: int = 0
    eps: float = EPS
    zero_std: float = EPS
    single: str = "zero"
    batch: str = "std"
    batch_ddof: int = 0
    batch_eps: float = EPS

    def __post_init__(self) -> None:
        if self.ddof not in (0, 1) or self.batch_ddof not in (0, 1):
            raise ValueError(f"GdpoOptions: ddof and batch_ddof must be 0 or 1, got {self.ddof}, {self.batch_ddof}")
        if self.batch not in BATCH_STEPS:
            raise ValueError(f"GdpoOptions.batch: {self.batch!r} is not one of {BATCH_STEPS}")
        if self.single not in SINGLE:
            raise ValueError(f"GdpoOptions.single: {self.single!r} is not one of {SINGLE}")
        if self.eps < 0 or self.batch_eps < 0 or self.zero_std < 0:
            raise ValueError(f"GdpoOptions: eps, batch_eps and zero_std must be >= 0, got {self.eps}, "
                             f"{self.batch_eps}, {self.zero_std}")



RELEVANCES = ("js", "logprob_drop", "logprob_abs", "logprob_signed")
# Noise floors (mean relevance per token; nats, JS in nats): the 10th percentile of a placebo pair's mean
# relevance (the same prompt with and without one content-free feedback section) on the dev split of
# bench/localization with SmolLM2-135M-Instruct, feedback style auto, ablation drop: a pair that moves the
# policy less than 9 in 10 content-free sections do is noise. `bench/bench_localization.py` measures them.
DEFAULT_FLOORS = {"js": 0.0022, "logprob_drop": 0.0218, "logprob_abs": 0.0522, "logprob_signed": 0.0212}


# mc: Monte-Carlo values of tree-sampled groups (method.md 3b; needs SamplingConfig.tree)
CREDIT_KINDS = ("gdpo", "mrtpo", "p2t", "mc")
# Where MRTPO's relevance comes from (method.md section 2): the leave-one-out replay, the verifier's spans
# (1 on the tokens that overlap one), or the spans where a penalized reward has them and the replay elsewhere
LOCATES = ("replay", "verifier", "both")


@dataclass(frozen=True)
class CreditConfig:
    kinds: tuple[str, ...] = ("gdpo", "mrtpo")
    beta: float = 0.5
    max_second_moment: float | None = None
    # MRTPO's relevance, ablation and feedback style: the defaults localize best on the dev split of
    # bench/localization with SmolLM2-135M-Instruct (bench/RESULTS.md)
    relevance: str = "logprob_signed"
    locate: str = "both"  # LOCATES; `both` skips the replay of the pairs the verifier locates
    ablation: str = "drop"
    feedback_style: str = "auto"
    relevance_floor: float | None = None  # None: the option's calibrated floor (relevance.DEFAULT_FLOORS)
    store_js: bool = False  # also store the paper's JS distance beside another relevance
    replay_batch_size: int = 16
    chunk_size: int = 128
    p2t_form: str = "paper"
    p2t_omega: float = 0.6
    p2t_alpha: float = 0.1
    p2t_baseline: str = "pad"
    gdpo: GdpoOptions = field(default_factory=GdpoOptions)
    # w_k by reward name (an instruction constraint "c2_title" also matches "title"); others weigh 1
    reward_weights: tuple[tuple[str, float], ...] = ()
    # GDPO's conditioned reward: (primary reward name, threshold); the other rewards of a response count
    # only when its primary reward reaches the threshold
    condition: tuple[str, float] | None = None

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - set(CREDIT_KINDS)
        if unknown or "gdpo" not in self.kinds:
            raise ValueError(f"credit kinds {self.kinds}: each must be one of {CREDIT_KINDS}, gdpo included")
        object.__setattr__(self, "reward_weights", tuple(tuple(w) for w in self.reward_weights))
        if self.condition is not None:
            object.__setattr__(self, "condition", tuple(self.condition))
        for name, value, allowed in (("relevance", self.relevance, RELEVANCES), ("locate", self.locate, LOCATES),
                                     ("ablation", self.ablation, ABLATIONS),
                                     ("feedback_style", self.feedback_style, FEEDBACK_STYLES)):
            if value not in allowed:
                raise ValueError(f"credit {name} {value!r}: choose from {', '.join(allowed)}")
        if self.relevance_floor is not None and self.relevance_floor < 0:
            raise ValueError(f"credit relevance_floor must be >= 0, got {self.relevance_floor}")

    @property
    def floor(self) -> float:
        return DEFAULT_FLOORS[self.relevance] if self.relevance_floor is None else self.relevance_floor


MIN_VERIFIER_MEMORY = 256_000_000  # bytes: the verifier worker's interpreter and imports take ~0.15 GB
_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


MAX_BYTES = 2**63 - 1  # what RLIMIT_AS and friends can hold


def parse_bytes(text: str) -> int:
    """'1GB' -> 1_000_000_000, '512MiB' -> 536_870_912, '2e9' -> 2_000_000_000 (bytes)."""
    found = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    if not found or found[2].upper() not in _SIZE_UNITS:
        raise ValueError(f"{text!r} is not a size: expected a number of bytes with KB, MB, GB or KiB, MiB, "
                         "GiB, such as 2GB")
    size = float(found[1]) * _SIZE_UNITS[found[2].upper()]
    if not size <= MAX_BYTES:  # 1e400GB overflows to inf
        raise ValueError(f"{text!r} is past the largest size, {MAX_BYTES} bytes")
    return int(size)


# AdamW moves every weight by about lr per step whatever the gradient's scale: past 1 a step is larger than the
# weights themselves (a policy's are mostly below 1), and `--lr 1e30` made every tensor NaN by the second step
MAX_LR = 1.0


def check_lr(lr: float, name: str) -> None:
    """ValueError naming `name` (an option or a design key) unless `lr` is a learning rate in (0, MAX_LR]."""
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr <= MAX_LR:  # NaN fails too
        raise ValueError(f"{name}: {lr!r} is no learning rate; expected a number > 0 and at most {MAX_LR:g} "
                         f"(AdamW moves every weight by about that much per step)")


DEMO_LIMIT = 16  # prompts per task of the demo set unless a limit is given
AUTO_LIMIT = "auto"


@dataclass(frozen=True)
class AnnotateConfig:
    """Everything that determines the dataset (hashed into the run's identity)."""

    prompts: str = "demo"
    format: str = "native"  # of the prompt file: see `tokencredit.verifiers.formats`
    databases: str | None = None  # folder `db` paths resolve in (None: beside the prompt file)
    semantics: str | None = None  # e.g. "ifeval", "bfcl", "tokencredit"; None = the format's default
    columns: tuple[tuple[str, str], ...] = ()  # (native field, source column or 'constant') renames
    verifiers: tuple[PluginRef, ...] = ()  # plugin verifiers, source hashes included
    # per response, for its built-in verifiers (in this process) and as many for its plugins (in a
    # worker process); past it the response is a verifier_error
    verifier_timeout_s: float = 5.0
    # the memory of the plugin verifiers' worker process (heap and private mappings, its interpreter's
    # ~0.15 GB included); an allocation past it makes that response a verifier_error. A laptop survives 2 GB.
    verifier_memory_bytes: int = 2_000_000_000
    tasks: tuple[str, ...] | None = None  # None = every task of the prompt set
    split: str | None = None  # None = all records
    limit: int | str | None = "auto"  # prompts per task; None = all; "auto": DEMO_LIMIT of the demo set, else all
    backend: str = "transformers"
    model: str | None = None  # None = the shipped tiny policy
    reward_model: str | None = None  # None = the shipped tiny reward model
    device: str = "cpu"
    # the sampling engine's dtype: float32, or bfloat16/float16 with the vllm backend (the transformers backend
    # samples and replays with one float32 copy of the policy); bfloat16 moves the stored log-probs (docs/engine.md)
    dtype: str = "float32"
    shard_size: int = 8  # prompts per shard
    # torch threads on CPU: float sums are split by thread, so the count changes the last bits of
    # every log-prob; fixing it makes a Dask worker (1 thread by default) write the same bytes.
    cpu_threads: int = 2
    # with the vllm backend, the sequences one engine call samples: consecutive shards are sampled together up to
    # it (`annotate.windows_of`); None = the engine's batch, max_num_seqs (256 on CPU, 1,024 on CUDA). What shares
    # a batch changes the log-probs' last bits, so it is part of the run's identity.
    engine_batch: int | None = None
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    credit: CreditConfig = field(default_factory=CreditConfig)

    def __post_init__(self) -> None:
        # Absolute paths, so that a run's manifest names the same files from any working directory
        for name in ("prompts", "databases", "model", "reward_model"):
            object.__setattr__(self, name, _absolute(getattr(self, name), local_only=name in ("model", "reward_model")))
        if self.limit == AUTO_LIMIT:  # a user's own prompt file is read whole; the demo's first prompts suffice
            object.__setattr__(self, "limit", DEMO_LIMIT if self.prompts == "demo" else None)
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 1):
            raise ValueError(f"AnnotateConfig.limit: expected a positive number of prompts per task, None (all) "
                             f"or {AUTO_LIMIT!r}, got {self.limit!r}")
        if not self.verifier_timeout_s > 0:
            raise ValueError(f"AnnotateConfig.verifier_timeout_s must be > 0, got {self.verifier_timeout_s!r}")
        if not isinstance(self.verifier_memory_bytes, int) or self.verifier_memory_bytes < MIN_VERIFIER_MEMORY:
            raise ValueError(f"AnnotateConfig.verifier_memory_bytes must be an int of at least {MIN_VERIFIER_MEMORY} "
                             f"(the worker's interpreter and imports), got {self.verifier_memory_bytes!r}")
        if self.backend not in ("transformers", "vllm"):
            raise ValueError(f"AnnotateConfig.backend {self.backend!r}: transformers or vllm (the CLI's --backend auto "
                             "picks one before the config is built)")
        if self.engine_batch is not None and (not isinstance(self.engine_batch, int) or self.engine_batch < 1):
            raise ValueError(f"--engine-batch {self.engine_batch!r}: a positive number of sequences")
        if self.dtype not in ENGINE_DTYPES:
            raise ValueError(f"--dtype {self.dtype}: choose from {', '.join(ENGINE_DTYPES)}")
        if self.dtype != "float32" and self.backend != "vllm":
            raise ValueError(f"--dtype {self.dtype} needs --backend vllm (the transformers backend samples and replays "
                             "with one float32 copy of the policy)")
        if "mc" in self.credit.kinds and self.sampling.tree is None:
            raise ValueError("credit mc needs tree-sampled groups: its values are means over the leaves below each "
                             "node; add --tree R,L (SamplingConfig.tree)")
        for ref in self.verifiers:  # the run's identity records each by its importable target and source hash
            if type(ref) is not PluginRef:
                raise TypeError(f"AnnotateConfig.verifiers: {ref!r} is not an importable verifier; annotate records "
                                "each verifier by its target: pass verifiers.plugins.resolve(['TASK=module:name']) "
                                "(a verifier object at module level in my_rewards.py is 'TASK=my_rewards:name')")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def digest(self) -> str:
        fields = self.to_dict()
        for name, default in IDENTITY_DEFAULTS.items():  # runs started before the field existed keep their identity
            if fields[name] == default:
                del fields[name]
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


# Fields added to AnnotateConfig after runs were written: left out of the digest at these values, which is what
# those runs ran with
IDENTITY_DEFAULTS = {"dtype": "float32", "engine_batch": None}
ENGINE_DTYPES = ("float32", "bfloat16", "float16")


def _absolute(path: str | None, local_only: bool) -> str | None:
    """`path` made absolute; None and the demo set as they are. With `local_only` (a model: a registry
    name or a Hugging Face repo id are names, not paths), only an existing folder that is not a
    registry name."""
    if path is None or path == "demo":
        return path
    folder = Path(path).expanduser()
    if local_only and (path in MODELS or not folder.is_dir()):
        return path
    return str(folder.resolve())
