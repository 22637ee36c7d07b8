"""Tree-sampled groups (method.md 3b) and continuations of response prefixes, with the transformers backend.

    samples = sample_trees(sampler, records, SamplingConfig(tree=(4, 4)))   # R * L leaves per record
    outs = continue_prefixes(sampler, prompt_ids, prefix_ids, seeds, config)  # K continuations per prefix

A tree of `config.tree = (R, L)` per prompt: R roots are drawn up to a branch point (`config.branch`, below),
then each root is continued L times; (R, L1, L2) branches once more below each continuation. Every leaf is a
full response (root tokens, then its continuation's), with its path in `Sample.segments`.

Where a node branches (`config.branch`, checked before each token is drawn, from the node's start):
- `fraction:F`: after int(F * max_new_tokens) tokens of the node (F = 0: an empty root, so the leaves are
  flat samples of the prompt);
- `sentence`: after the node's first token that ends a sentence or a line (its text ends in . ! or ?, or holds a
  newline);
- `entropy:Q`: at the first token, ENTROPY_MIN_TOKENS or more into the node, whose sampling entropy (of
  softmax(logits / temperature)) is in the top Q of the node's token entropies so far: the leaves then differ
  at a token the policy is unsure of (TreeRL).

A node that ends (eos, a stop string, the budget) before its branch point cannot branch: each of its
continuations is empty, so its L leaves are copies of it. That keeps each root's weight in the group at L
leaves, as every other root's: the group's mean over leaves stays the mean of its roots' values, and the leaf
copies carry the reward the node earned (their segments below it are empty: [T, T)).

Draws: node "t<r>" of record `id` (and "t<r>.<l>", "t<r>.<l1>.<l2>") draws from its own generator,
seeded by `node_seed(seed, id, node)`, by inverse CDF (`choose_tokens`) as flat sampling does. A
continuation's tokens are therefore those of flat sampling from the prompt with the node's prefix appended
and the continuation's seed (up to the last float bits of the logits: the prefix's cache was built token
by token, a prefill computes it at once). Leaf j (depth first: j = r * L + l) keeps response id
f"{id}/{j}", so verify, credit and write treat it as any response.

Sharing: each batch prefills every distinct prompt once; the roots decode from copies of that cache, and a
node that branches has its cache row copied to its continuations (`DynamicCache.batch_select_indices` with
repeated indices), so no prefix is fed twice. The sampler's `prefilled_tokens` and `decoded_tokens` count it.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from tokencredit.schemas.records import Sample, Segment, TaskRecord

from tokencredit.pipeline.config import SamplingConfig, parse_branch
from tokencredit.pipeline.progress import Progress
from tokencredit.pipeline.sample.detokenize import StopChecker
from tokencredit.pipeline.sample.rows import Row, build_sample, node_seed, render_prompt

ENTROPY_MIN_TOKENS = 4  # `entropy:Q` branches no earlier than this many tokens into a node
SENTENCE_ENDS = (".", "!", "?")


@dataclass
class NodeRow(Row):
    """A row of a tree: the node it is drawing (`path`: its index at each level, (r,) for root r) and
    where each node of that path starts in the response."""

    record_id: str = ""
    path: tuple[int, ...] = ()
    starts: list[int] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)  # of the current node's tokens (`entropy:Q` only)


def node_name(path: Sequence[int]) -> str:
    """"t2" for root 2, "t2.1" for its continuation 1: the node's part of its id and of its seed."""
    return "t" + ".".join(map(str, path))


def node_id(record_id: str, path: Sequence[int]) -> str:
    return f"{record_id}/{node_name(path)}"


def leaf_index(path: Sequence[int], tree: Sequence[int]) -> int:
    """Depth-first index of a leaf: j = r * L + l (or (r * L1 + l1) * L2 + l2)."""
    j = 0
    for index, width in zip(path, tree):
        j = j * width + index
    return j


# `sampler` below is a transformers_backend.TransformersSampler (which imports this module to sample trees)


class BranchRule:
    """Decides, before a token is drawn, whether a row's node ends there (module docstring)."""

    def __init__(self, sampler, config: SamplingConfig):
        self.kind, self.value = parse_branch(config.branch)
        self.tokens = config.branch_tokens if self.kind == "fraction" else None
        self.temperature = config.temperature or 1.0
        self.tokenizer, self._ends = sampler.tokenizer, {}

    def entropies(self, logits: torch.Tensor) -> list[float] | None:
        """logits [B, V] -> the sampling entropy of each row (nats), only for `entropy:Q`."""
        if self.kind != "entropy":
            return None
        logp = torch.log_softmax(logits.float() / self.temperature, -1)
        return (-(logp.exp() * logp).sum(-1)).tolist()

    def fires(self, row: NodeRow, entropy: float | None) -> bool:
        length = len(row.tokens) - row.starts[-1]
        if self.kind == "fraction":
            return length == self.tokens
        if self.kind == "sentence":
            return length > 0 and self._ends_sentence(row.tokens[-1])
        row.entropies.append(entropy)
        if length < ENTROPY_MIN_TOKENS:
            return False
        return entropy >= torch.tensor(row.entropies).quantile(1 - self.value).item()

    def _ends_sentence(self, token: int) -> bool:
        if token not in self._ends:
            text = self.tokenizer.decode([token], skip_special_tokens=True)
            self._ends[token] = "\n" in text or text.rstrip().endswith(SENTENCE_ENDS) and bool(text.strip())
        return self._ends[token]


class TreeSplit:
    """The `Split` of one batch of trees: a row whose node reaches its branch point is replaced by its
    continuations (recursively: an empty node can branch again at once)."""

    def __init__(self, rule: BranchRule, config: SamplingConfig):
        self.rule, self.config = rule, config

    def __call__(self, active: list[NodeRow], logits: torch.Tensor) -> list[list[NodeRow]] | None:
        inner = len(self.config.tree) - 1  # levels that branch
        if all(len(row.path) > inner for row in active):
            return None
        entropies = self.rule.entropies(logits) or [None] * len(active)
        replaced = [self.expand(row, h) for row, h in zip(active, entropies)]
        return replaced if any(kids != [row] for kids, row in zip(replaced, active)) else None

    def expand(self, row: NodeRow, entropy: float | None) -> list[NodeRow]:
        if len(row.path) >= len(self.config.tree) or not self.rule.fires(row, entropy):
            return [row]
        return [kid for kids in (self.expand(child, entropy) for child in self.children(row)) for kid in kids]

    def children(self, row: NodeRow) -> list[NodeRow]:
        seed = self.config.seed
        return [NodeRow(torch.Generator().manual_seed(node_seed(seed, row.record_id, node_name((*row.path, l)))),
                        row.stop.fork(), row.limit, list(row.tokens), list(row.logprobs), row.record_id,
                        (*row.path, l), [*row.starts, len(row.tokens)])
                for l in range(self.config.tree[len(row.path)])]


def leaves_of(row: NodeRow, tree: Sequence[int]) -> list[tuple[tuple[int, ...], list[int]]]:
    """(leaf path, node starts) of every leaf below an ended row: the row itself at the last level, else
    copies of it whose nodes below it are empty."""
    below = itertools.product(*(range(width) for width in tree[len(row.path):]))
    end = len(row.tokens)
    return [((*row.path, *rest), [*row.starts, *[end] * len(rest)]) for rest in below]


def segments(record_id: str, path: Sequence[int], starts: Sequence[int], length: int) -> tuple[Segment, ...]:
    """A leaf's nodes root -> leaf with their token ranges [start, end) in its response of `length` tokens."""
    ends = [*starts[1:], length]
    return tuple(Segment(node_id(record_id, path[:d + 1]), node_id(record_id, path[:d]) if d else None,
                         starts[d], ends[d]) for d in range(len(path)))


def sample_trees(sampler, records: Sequence[TaskRecord], config: SamplingConfig) -> list[Sample]:
    """`config.tree`'s leaves per record (record order, then leaf index j), each a `Sample` with `segments`.
    A batch holds as many whole trees as fit the sampler's batch of leaves (`batch_rows`; one at least)."""
    prompts = {r.id: render_prompt(sampler.tokenizer, r.prompt) for r in records}
    leaves, roots = config.leaves_per_tree, config.tree[0]
    per_batch = max(1, sampler.batch_rows(config, max(len(p[1]) for p in prompts.values())) // leaves)
    split = TreeSplit(BranchRule(sampler, config), config)
    samples = []
    with Progress("sampling", total=len(records) * leaves, unit="response", enabled=sampler.progress) as bar:
        for start in range(0, len(records), per_batch):
            batch = records[start: start + per_batch]
            rows = [NodeRow(torch.Generator().manual_seed(node_seed(config.seed, r.id, node_name((i,)))),
                            StopChecker(sampler.tokenizer, config.stop), config.max_new_tokens,
                            record_id=r.id, path=(i,), starts=[0]) for r in batch for i in range(roots)]
            ended = sampler.decode([prompts[r.id][1] for r in batch for _ in range(roots)], rows, config, split)
            found = {(row.record_id, path): (row, starts) for row in ended for path, starts in leaves_of(row, config.tree)}
            for record in batch:
                for path in itertools.product(*map(range, config.tree)):
                    row, starts = found[record.id, path]
                    samples.append(build_sample(record, leaf_index(path, config.tree), prompts[record.id], list(row.tokens),
                                                list(row.logprobs), sampler.tokenizer, sampler.name, config.seed,
                                                segments(record.id, path, starts, len(row.tokens))))
            bar.update(len(batch) * leaves, tokens=sum(len(s.token_ids) for s in samples[-len(batch) * leaves:]))
    return samples


def continue_prefixes(sampler, prompts: Sequence[Sequence[int]],
                      prefixes: Sequence[Sequence[int]], seeds: Sequence[Sequence[int]],
                      config: SamplingConfig) -> list[list[tuple[list[int], list[float]]]]:
    """Continue response prefix i (`prefixes[i]`, after prompt ids `prompts[i]`) once per seed of `seeds[i]`.

    -> out[i][k] = (continuation ids, raw log-probs), at most max_new_tokens - len(prefixes[i]) tokens (a
    prefix that fills the budget gets empty continuations); a stop string counts over the whole response,
    prefix included. Temperature, top-p, stop and max_new_tokens are `config`'s; draws are the seed's, as
    flat sampling's with the prefix appended to the prompt. Each prefix is prefilled once per batch of at
    most the sampler's batch (`batch_rows`) of continuations (a prefix's continuations stay in one batch) and its cache
    copied to its continuations.
    """
    if not len(prompts) == len(prefixes) == len(seeds):
        raise ValueError(f"continue_prefixes: {len(prompts)} prompts, {len(prefixes)} prefixes and {len(seeds)} "
                         "seed lists; give one of each per prefix")
    if hasattr(sampler, "continue_prefixes"):  # an engine that batches on its own (vllm_backend.VllmSampler)
        return sampler.continue_prefixes(prompts, prefixes, seeds, config)
    out: list[list[tuple[list[int], list[float]]]] = [[([], []) for _ in s] for s in seeds]
    todo = [i for i in range(len(prefixes)) if seeds[i] and len(prefixes[i]) < config.max_new_tokens]
    longest = max((len(prompts[i]) + len(prefixes[i]) for i in todo), default=0)
    for batch in _batches(todo, [len(seeds[i]) for i in todo], sampler.batch_rows(config, longest)):
        stop = {i: StopChecker(sampler.tokenizer, config.stop).fork(prefixes[i]) for i in batch}
        rows = [(i, k, sampler.row(seed, config.max_new_tokens - len(prefixes[i]), stop[i].fork()))
                for i in batch for k, seed in enumerate(seeds[i])]
        sampler.decode([[*prompts[i], *prefixes[i]] for i, _, _ in rows], [row for _, _, row in rows], config)
        for i, k, row in rows:
            out[i][k] = (row.tokens, row.logprobs)
    return out


def _batches(items: list[int], sizes: list[int], limit: int) -> list[list[int]]:
    """Consecutive runs of `items` whose sizes sum to at most `limit` (a larger item alone)."""
    batches, total = [], math.inf
    for item, size in zip(items, sizes):
        if total + size > limit:
            batches.append([])
            total = 0
        batches[-1].append(item)
        total += size
    return batches


# Bytes a sampled token of a leaf keeps in Python until its shard is written: its id and log-prob as list items
# (an int and a float object, two list slots) and its share of the detokenized text.
LEAF_TOKEN_BYTES = 80


def tree_bytes(config: SamplingConfig, model_config: dict, width: int = 4) -> int:
    """A lower bound on the memory sampling one tree of `config.tree` takes: its leaves decode in one batch
    (`sample_trees` keeps a tree whole), each with a KV cache of `width`-byte floats over its `max_new_tokens`
    (its prompt's not counted), the float32 logits and sampling buffers of a row (4 x vocabulary), and its tokens
    kept until the shard is written (LEAF_TOKEN_BYTES each). model_config: the policy's config.json."""
    layers = model_config["num_hidden_layers"]
    heads = model_config.get("num_key_value_heads") or model_config["num_attention_heads"]
    head_dim = model_config.get("head_dim") or model_config["hidden_size"] // model_config["num_attention_heads"]
    tokens = config.max_new_tokens
    row = 2 * layers * heads * head_dim * width * tokens + 4 * 4 * model_config["vocab_size"] + LEAF_TOKEN_BYTES * tokens
    return config.leaves_per_tree * row


def available_bytes(device: str) -> int | None:
    """Memory free for sampling on `device`: CUDA's own count, else MemAvailable of /proc/meminfo (None where
    unknown)."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.mem_get_info(torch.device(device))[0]
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None


def check_tree_fits(config: SamplingConfig, model_config: dict, device: str) -> None:
    """ValueError naming --tree when one tree's leaves cannot fit the memory free on `device` (`tree_bytes`),
    before anything is sampled."""
    need, free = tree_bytes(config, model_config), available_bytes(device)
    if free is not None and need > free:
        raise ValueError(f"--tree {','.join(map(str, config.tree))}: one tree's {config.leaves_per_tree} leaves of up "
                         f"to {config.max_new_tokens} tokens (--max-new-tokens) decode in one batch and need at least "
                         f"{need / 1e9:.3g} GB; {device} has {free / 1e9:.3g} GB free: choose fewer leaves or "
                         f"shorter responses")
