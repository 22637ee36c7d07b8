"""Tree-sampled groups level by level, for an engine that continues prefixes in its own batches (vLLM).

    samples = sample_tree_levels(sampler, records, SamplingConfig(tree=(4, 4)))   # as sample.tree.sample_trees

The trees are those of `sample.tree` (same nodes, seeds, branch rules, leaf order and segments; see its
docstring): the roots of every record are drawn first, up to their branch point, then every node that
branched is continued by requests whose prompt is the record's prompt ids followed by the node's tokens, so
the engine's prefix cache holds each shared prefix once. A branch point is a request's end: `fraction:F` its
max_tokens, `sentence` the sentence-ending tokens as stop tokens. `entropy:Q` needs each step's full
distribution, which the engine does not return: it is refused.

`sampler` here has `tokenizer`, `name`, `eos_ids` and `generate(prompts, seeds, config, prefixes, limits,
stop_token_ids)` (`vllm_backend.VllmSampler`).
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence

from tokencredit.schemas.records import Sample, TaskRecord

from tokencredit.pipeline.config import SamplingConfig, parse_branch
from tokencredit.pipeline.sample.detokenize import stop_reached
from tokencredit.pipeline.sample.rows import build_sample, node_seed, render_prompt
from tokencredit.pipeline.sample.tree import BranchRule, leaf_index, node_name, segments


def sentence_end_ids(sampler, config: SamplingConfig) -> list[int]:
    """Every token id whose text ends a sentence by `BranchRule`'s test (cached on the sampler)."""
    if getattr(sampler, "_sentence_ends", None) is None:
        rule = BranchRule(sampler, config)
        sampler._sentence_ends = [t for t in range(len(sampler.tokenizer)) if rule._ends_sentence(t)]
    return sampler._sentence_ends


def sample_tree_levels(sampler, records: Sequence[TaskRecord], config: SamplingConfig) -> list[Sample]:
    """`config.tree`'s leaves per record (record order, then leaf index j), each a `Sample` with `segments`."""
    kind, _ = parse_branch(config.branch)
    if kind == "entropy":
        raise ValueError(f"--branch {config.branch}: the vllm backend returns the sampled token's log-prob, not "
                         "each step's entropy; use --branch sentence or fraction:F, or --backend transformers")
    prompts = {r.id: render_prompt(sampler.tokenizer, r.prompt) for r in records}
    stops = sentence_end_ids(sampler, config) if kind == "sentence" else []
    # a node being drawn: (record, path, tokens of the response so far, their log-probs, where each node starts)
    frontier = [(r, (i,), [], [], [0]) for r in records for i in range(config.tree[0])]
    leaves = {}
    for level in range(len(config.tree)):
        branches = level < len(config.tree) - 1
        limits = [config.max_new_tokens - len(tokens) for _, _, tokens, _, _ in frontier]
        if branches and kind == "fraction":
            limits = [min(limit, config.branch_tokens) for limit in limits]
        new, new_logprobs = sampler.generate(
            [prompts[r.id][1] for r, *_ in frontier], [node_seed(config.seed, r.id, node_name(path))
                                                       for r, path, *_ in frontier],
            config, prefixes=[tokens for _, _, tokens, _, _ in frontier], limits=limits,
            stop_token_ids=stops if branches else ())
        after = []
        for (record, path, tokens, logprobs, starts), ids, lps in zip(frontier, new, new_logprobs):
            tokens, logprobs = [*tokens, *ids], [*logprobs, *lps]
            ended = (len(tokens) >= config.max_new_tokens or (ids and ids[-1] in sampler.eos_ids)
                     or (ids and stop_reached(sampler.tokenizer, tokens, config.stop)))
            branched = branches and not ended and (len(ids) == config.branch_tokens if kind == "fraction"
                                                   else bool(ids) and ids[-1] in stops)
            if branched:
                after += [(record, (*path, l), tokens, logprobs, [*starts, len(tokens)])
                          for l in range(config.tree[level + 1])]
                continue
            for rest in itertools.product(*(range(width) for width in config.tree[len(path):])):
                leaves[record.id, (*path, *rest)] = (tokens, logprobs, [*starts, *[len(tokens)] * len(rest)])
        frontier = after
    samples = []
    for record in records:
        for path in itertools.product(*map(range, config.tree)):
            tokens, logprobs, starts = leaves[record.id, path]
            samples.append(build_sample(record, leaf_index(path, config.tree), prompts[record.id], list(tokens),
                                        list(logprobs), sampler.tokenizer, sampler.name, config.seed,
                                        segments(record.id, path, starts, len(tokens))))
    return samples
