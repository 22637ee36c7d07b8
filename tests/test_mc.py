"""Monte-Carlo credit `mc` of tree-sampled groups (method.md section 3b): its invariants against GDPO and a
per-leaf loop, the credit stage on a tree group verified by the real instruction verifier, and the column read
back through the real Parquet writer, the DuckDB views, an export and a training run of the shipped tiny policy."""
from __future__ import annotations

import csv
import dataclasses
import random
import re
from collections import defaultdict

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from tokencredit.flows import cli
from tokencredit.pipeline.annotate import verify_samples
from tokencredit.pipeline.config import CreditConfig, GdpoOptions
from tokencredit.pipeline.credit.advantages import PRESETS, batch_statistics, gdpo
from tokencredit.pipeline.credit.assign import assign_credit
from tokencredit.pipeline.credit.mc import NEEDS_TREE, mc_advantages, tree_tensors
from tokencredit.pipeline.dataset.export import export_hf
from tokencredit.pipeline.dataset.query import connect
from tokencredit.pipeline.dataset.tables import credits_table, responses_table
from tokencredit.pipeline.dataset.training import read_training
from tokencredit.pipeline.dataset.writer import RunWriter
from tokencredit.pipeline.models.loading import DEFAULT_POLICY, load_tokenizer
from tokencredit.pipeline.sample.rows import render_prompt
from tokencredit.pipeline.train.trainer import TrainConfig, train
from tokencredit.schemas.records import Constraint, InstructionSpec, Sample, Segment, TaskRecord


# --- tree-sampled groups by hand ------------------------------------------------------------------


def tree_group(group_id: str, branching: tuple[int, ...], length) -> list[Sample]:
    """The leaves of one tree: `branching` (R, L) or (R, L1, L2) children per level, node ids as the sampler
    names them ("g/t1.0"); `length(node_id, depth)` is the number of tokens of that node's segment."""
    leaves = []

    def grow(path: tuple[Segment, ...], parent: str | None, end: int) -> None:
        depth = len(path)
        for j in range(branching[depth]):
            node_id = f"{parent}.{j}" if parent else f"{group_id}/t{j}"
            segment = Segment(node_id, parent, end, end + length(node_id, depth))
            if depth + 1 < len(branching):
                grow((*path, segment), node_id, segment.end)
                continue
            ids = list(range(segment.end))
            leaves.append(Sample(node_id, group_id, "instructions", "", [], "", ids, [0.0] * len(ids), "m", 0,
                                 (*path, segment)))

    grow((), None, 0)
    return leaves


def random_lengths(seed: int, empty: float = 0.2, most: int = 4, leaf_depth: int | None = None):
    """Segment lengths 0..most (0 with probability `empty`; never at `leaf_depth`), fixed per node."""
    rng, drawn = random.Random(seed), {}

    def length(node_id: str, depth: int) -> int:
        if node_id not in drawn:
            drawn[node_id] = 0 if rng.random() < empty and depth != leaf_depth else rng.randint(1, most)
        return drawn[node_id]
    return length


def flat_lengths(seed: int):
    """Each leaf its own root: the root's segment empty (branch at token 0), the leaf's 1..6 tokens."""
    rng = random.Random(seed)
    return lambda node_id, depth: 0 if depth == 0 else rng.randint(1, 6)


def tensors(samples: list[Sample]):
    node, bounds = tree_tensors(samples)
    ids: dict[str, int] = {}
    group = torch.tensor([ids.setdefault(s.group_id, len(ids)) for s in samples])
    return group, node, bounds


def scores(seed: int, N: int, K: int) -> torch.Tensor:
    """Rewards with ties and partial credit, as verifiers give them."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 5, (N, K), generator=g) / 4).float()


def loop_mc(samples, rewards, mask, options: GdpoOptions = PRESETS["method"]) -> list[np.ndarray]:
    """A per-leaf, per-reward reading of method.md 3b, float64: [K, T_i] per leaf."""
    groups = defaultdict(list)
    for i, s in enumerate(samples):
        groups[s.group_id].append(i)
    out = []
    for i, s in enumerate(samples):
        adv = np.zeros((rewards.shape[1], len(s.token_ids)))
        for k in range(rewards.shape[1]):
            valid = [j for j in groups[s.group_id] if mask[j, k]]
            r = {j: float(rewards[j, k]) for j in valid}
            if not mask[i, k] or len(valid) < 2:
                continue
            std = float(np.std(list(r.values()), ddof=options.ddof))
            if std <= options.zero_std:
                continue
            base = float(np.mean(list(r.values())))
            for d, seg in enumerate(s.segments):
                below = [r[j] for j in valid if seg.node_id in {g.node_id for g in samples[j].segments}]
                value = r[i] if d == len(s.segments) - 1 else float(np.mean(below))
                adv[k, seg.start:seg.end] = (value - base) / (std + options.eps)
                if seg.end > seg.start:
                    base = value
        out.append(adv)
    return out


# --- invariants ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("branching", [(3, 2), (2, 2, 2), (2, 3, 2)])
def test_mc_matches_a_per_leaf_loop(seed, branching):
    samples = tree_group("a", branching, random_lengths(seed)) + tree_group("b", branching, random_lengths(seed + 9))
    rewards = scores(seed, len(samples), 3)
    mask = torch.rand(len(samples), 3, generator=torch.Generator().manual_seed(seed)) > 0.15
    options = GdpoOptions(ddof=seed % 2)
    result = mc_advantages(rewards, mask, *tensors(samples), options)
    for i, expected in enumerate(loop_mc(samples, rewards, mask, options)):
        T = expected.shape[1]
        np.testing.assert_allclose(result.token_adv[i, :, :T].numpy(), expected, atol=1e-6)
        assert not result.token_adv[i, :, T:].any()  # padding


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("branching", [(4, 4), (2, 3, 2)])
def test_segment_values_telescope_to_gdpos_advantage(seed, branching):
    """Any inner segment may be empty (a branch at token 0); a leaf's own holds tokens (the sampler continues a
    node that has not ended)."""
    leaf_depth = len(branching) - 1
    samples = [s for g in "abc" for s in tree_group(g, branching, random_lengths(seed * 3 + ord(g), 0.3,
                                                                                 leaf_depth=leaf_depth))]
    rewards = scores(seed, len(samples), 2)
    mask = torch.ones_like(rewards, dtype=torch.bool)
    result = mc_advantages(rewards, mask, *tensors(samples))
    reference = gdpo(rewards, mask, tensors(samples)[0])
    telescoped = torch.zeros_like(rewards, dtype=torch.float64)
    for i, s in enumerate(samples):
        for seg in s.segments:
            if seg.end > seg.start:  # one value per segment; an empty one holds none
                telescoped[i] += result.token_adv[i, :, seg.start].double()
    assert torch.allclose(telescoped, reference.reward_adv.double(), atol=1e-6)
    assert any(seg.end == seg.start for s in samples for seg in s.segments)  # an empty segment was exercised
    assert reference.reward_adv.abs().sum() > 1  # the groups vary: the sums are not 0 = 0


@pytest.mark.parametrize("preset", ["method", "trl", "verl"])
def test_a_flat_group_gives_gdpos_token_advantages_bit_for_bit(preset):
    options = PRESETS[preset]
    samples = [s for j, (g, n) in enumerate([("a", 4), ("b", 3), ("one", 1), ("same", 4)])
               for s in tree_group(g, (n, 1), flat_lengths(j))]
    N = len(samples)
    rewards = scores(1, N, 3)
    rewards[-4:, 0] = 0.5  # a group without variance in reward 0
    mask = torch.ones(N, 3, dtype=torch.bool)
    mask[:4, 2] = False  # group a has two rewards only (an instruction record with fewer constraints)
    weights = torch.tensor([1.0, 0.5, 2.0])
    group, node, bounds = tensors(samples)
    lengths = bounds[:, -1]
    reference = gdpo(rewards, mask, group, options, weights=weights, lengths=lengths)
    result = mc_advantages(rewards, mask, group, node, bounds, options, weights=weights)
    for i in range(N):
        T = int(lengths[i])
        assert torch.equal(result.token_adv[i, :, :T], reference.reward_adv[i, :, None].expand(-1, T))
        assert torch.equal(result.summed[i, :T], reference.summed[i].expand(T))
    # verl gives a lone response r / (1 + eps), the others 0: the singleton group was exercised either way
    assert (reference.reward_adv[7] != 0).any() == (preset == "verl")


def test_sibling_leaves_share_their_common_segments_values():
    samples = tree_group("a", (2, 2, 2), lambda node_id, depth: 2)
    rewards = scores(3, len(samples), 2)
    result = mc_advantages(rewards, torch.ones_like(rewards, dtype=torch.bool), *tensors(samples))
    by_node = defaultdict(list)
    for i, s in enumerate(samples):
        for seg in s.segments:
            by_node[seg.node_id].append(result.token_adv[i, :, seg.start:seg.end])
    shared = {n: v for n, v in by_node.items() if len(v) > 1}
    assert len(shared) == 6  # 2 roots (4 leaves each) and 4 middle nodes (2 each)
    for values in shared.values():
        assert all(torch.equal(v, values[0]) for v in values)
    assert any(v[0].any() for v in shared.values())


def test_groups_computed_together_or_apart_are_identical():
    a = tree_group("a", (3, 2), random_lengths(1))
    b = tree_group("b", (2, 2, 2), random_lengths(2))
    together = a + b
    rewards = scores(5, len(together), 3)
    mask = torch.ones_like(rewards, dtype=torch.bool)
    both = mc_advantages(rewards, mask, *tensors(together), PRESETS["trl"])
    alone_a = mc_advantages(rewards[: len(a)], mask[: len(a)], *tensors(a), PRESETS["trl"])
    alone_b = mc_advantages(rewards[len(a):], mask[len(a):], *tensors(b), PRESETS["trl"])
    order = list(range(len(together)))
    random.Random(0).shuffle(order)
    shuffled = mc_advantages(rewards[order], mask[order], *tensors([together[i] for i in order]), PRESETS["trl"])
    for i, s in enumerate(together):
        T = len(s.token_ids)
        alone = alone_a.token_adv[i] if i < len(a) else alone_b.token_adv[i - len(a)]
        assert torch.equal(both.token_adv[i, :, :T], alone[:, :T])
        assert torch.equal(both.token_adv[i, :, :T], shuffled.token_adv[order.index(i), :, :T])


def test_a_group_whose_leaves_all_score_the_same_gets_zero():
    samples = tree_group("a", (4, 4), random_lengths(0))
    rewards = torch.tensor([[1.0, 0.25]]).expand(len(samples), 2).contiguous()
    result = mc_advantages(rewards, torch.ones_like(rewards, dtype=torch.bool), *tensors(samples))
    assert not result.token_adv.any() and not result.summed.any()


def test_an_empty_segment_passes_its_change_on():
    """One reward, leaves (1, 0 | 1, 1): V(x) = 3/4, population std sqrt(3)/4."""
    rewards = torch.tensor([[1.0], [0.0], [1.0], [1.0]])
    mask = torch.ones_like(rewards, dtype=torch.bool)
    s = np.sqrt(3) / 4 + 1e-6
    with_roots = tree_group("a", (2, 2), lambda node_id, depth: 3 - depth)  # roots of 3 tokens, leaves of 2
    result = mc_advantages(rewards, mask, *tensors(with_roots)).token_adv[:, 0]
    expected = [[-1 / 4] * 3 + [1 / 2] * 2, [-1 / 4] * 3 + [-1 / 2] * 2, [1 / 4] * 3 + [0] * 2, [1 / 4] * 3 + [0] * 2]
    np.testing.assert_allclose(result.numpy(), np.array(expected) / s, atol=1e-6)
    # branching at token 0: the roots hold nothing, the leaves get their change from the prompt (= GDPO)
    at_zero = tree_group("a", (2, 2), lambda node_id, depth: 2 * depth)
    result = mc_advantages(rewards, mask, *tensors(at_zero)).token_adv[:, 0]
    np.testing.assert_allclose(result.numpy(), np.array([[1 / 4] * 2, [-3 / 4] * 2, [1 / 4] * 2, [1 / 4] * 2]) / s,
                               atol=1e-6)
    # an empty middle node: its leaves' segments are measured from the root
    middle = tree_group("a", (1, 2, 2), lambda node_id, depth: {0: 2, 1: 0, 2: 1}[depth])
    result = mc_advantages(rewards, mask, *tensors(middle)).token_adv[:, 0]
    np.testing.assert_allclose(result[:, 2].numpy(), (rewards[:, 0].numpy() - 0.75) / s, atol=1e-6)


def test_a_masked_reward_gets_zero_and_does_not_count_in_the_values():
    samples = tree_group("a", (2, 2), random_lengths(4, empty=0))
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.25], [0.0, 1.0]])  # leaf 3's 1.0 would move V(t1)
    mask = torch.ones_like(rewards, dtype=torch.bool)
    mask[3, 1] = False
    result = mc_advantages(rewards, mask, *tensors(samples))
    assert not result.token_adv[3, 1].any()
    three = mc_advantages(rewards[:3, 1:], mask[:3, 1:], *tensors(samples[:3]))
    for i, s in enumerate(samples[:3]):
        T = len(s.token_ids)
        assert torch.equal(result.token_adv[i, 1, :T], three.token_adv[i, 0, :T])
    assert result.token_adv[2, 1, : samples[2].segments[0].end].any()  # root t1 is valued by leaf 2 alone


def test_bad_trees_are_named():
    good = tree_group("a", (2, 2), lambda node_id, depth: 2)
    flat = Sample("f0", "a", "instructions", "", [], "", [1, 2], [0.0, 0.0], "m", 0)
    with pytest.raises(ValueError, match=rf"{re.escape(NEEDS_TREE)}: response 'f0' \(record 'a'\) has no segments"):
        tree_tensors([*good, flat])
    gap = good[0].segments
    broken = Sample("x", "a", "instructions", "", [], "", list(range(4)), [0.0] * 4, "m", 0,
                    (gap[0], Segment("a/t0.9", "a/t0", 3, 4)))
    with pytest.raises(ValueError, match="response 'x': segments: .* does not follow"):
        tree_tensors([broken])
    short = Sample("y", "a", "instructions", "", [], "", list(range(9)), [0.0] * 9, "m", 0, gap)
    with pytest.raises(ValueError, match="response 'y': segments end at token 4, the response has 9"):
        tree_tensors([short])
    other_group = tree_group("b", (2, 2), lambda node_id, depth: 2)
    stray = Sample("a/t0.7", "b", "instructions", "", [], "", list(range(4)), [0.0] * 4, "m", 0,
                   (gap[0], Segment("a/t0.7", "a/t0", 2, 4)))
    with pytest.raises(ValueError, match="response 'a/t0.7': segments: node 'a/t0' .* response 'a/t0.0'"):
        tree_tensors([*good, *other_group, stray])
    twice = Sample("z", "a", "instructions", "", [], "", list(range(4)), [0.0] * 4, "m", 0, good[0].segments)
    with pytest.raises(ValueError, match="response 'z': segments: node 'a/t0.0'"):
        tree_tensors([*good, twice])


# --- the credit stage on a verified tree group ------------------------------------------------------

ROOTS = ["Rain falls,", "Rain falls"]  # the first root decides the comma: both its leaves fail no_commas
CONTINUATIONS = [[" it stops", " and stops"], [" and then it stops at noon", " softly"]]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(None)


def verified_tree(tokenizer):
    """One instruction record (no commas, at most 4 words) and its 2 x 2 tree, verified for real."""
    record = TaskRecord("rain", "instructions", "Describe rain.", None,
                        InstructionSpec((Constraint("no_commas", {}), Constraint("word_count", {"max": 4}))))
    prompt, prompt_ids = render_prompt(tokenizer, record.prompt)
    samples = []
    for r, (root, continuations) in enumerate(zip(ROOTS, CONTINUATIONS)):
        root_ids = tokenizer(root, add_special_tokens=False)["input_ids"]
        for j, text in enumerate(continuations):
            ids = root_ids + tokenizer(text, add_special_tokens=False)["input_ids"]
            segments = (Segment(f"rain/t{r}", None, 0, len(root_ids)),
                        Segment(f"rain/t{r}.{j}", f"rain/t{r}", len(root_ids), len(ids)))
            samples.append(Sample(f"rain/t{r}.{j}", "rain", "instructions", prompt, prompt_ids,
                                  tokenizer.decode(ids), ids, [-1.0] * len(ids), "tiny", 0, segments))
    return verify_samples(samples, {"rain": record}), {"rain": record}


def test_assign_credit_gives_each_segment_its_change_in_value(tokenizer):
    verified, records = verified_tree(tokenizer)
    assert [[r.score for r in v.rewards] for v in verified] == [[0, 1], [0, 1], [1, 0], [1, 1]]
    annotated, _ = assign_credit(verified, records, CreditConfig(kinds=("gdpo", "mc")), progress=False)
    for a in annotated:
        credit, (root, leaf) = a.credit, a.verified.sample.segments
        assert credit.relevance_source == ["rollout", "rollout"]
        assert credit.mrtpo_sum is None
        # telescoping: root + leaf segment = GDPO's A[i,k]
        for k in range(2):
            assert credit.mc[k][root.start] + credit.mc[k][leaf.start] == pytest.approx(credit.reward_adv[k], abs=1e-6)
        assert credit.mc_sum == pytest.approx([credit.mc[0][t] + credit.mc[1][t] for t in range(leaf.end)], abs=1e-6)
    # the comma is in root 0: no_commas debits root 0's tokens and nothing below it, where nothing changed
    no_commas = [a.credit.mc[0] for a in annotated]
    root0 = annotated[0].verified.sample.segments[0]
    assert all(v < 0 for v in no_commas[0][: root0.end]) and not any(no_commas[0][root0.end:])
    assert no_commas[0][: root0.end] == no_commas[1][: root0.end]
    # the word limit is decided by the continuation under root 1: its long leaf is debited there
    long_leaf = annotated[2].credit.mc[1]
    split = annotated[2].verified.sample.segments[1].start
    assert all(v < 0 for v in long_leaf[split:]) and all(v > 0 for v in annotated[3].credit.mc[1][split:])

    both, _ = assign_credit(verified, records, CreditConfig(kinds=("gdpo", "mrtpo", "mc"), locate="verifier"),
                            tokenizer=tokenizer, progress=False)
    for a, b in zip(annotated, both):
        assert b.credit.mc == a.credit.mc and b.credit.mc_sum == a.credit.mc_sum
        assert set(b.credit.relevance_source) <= {"verifier", "uniform"}  # MRTPO's own, as documented
    flat = [dataclasses.replace(v, sample=dataclasses.replace(v.sample, segments=None)) for v in verified]
    with pytest.raises(ValueError, match=rf"{re.escape(NEEDS_TREE)}: response 'rain/t0.0'"):
        assign_credit(flat, records, CreditConfig(kinds=("gdpo", "mc")), progress=False)


def write_tree_run(folder, tokenizer) -> tuple[str, list]:
    verified, records = verified_tree(tokenizer)
    annotated, stats = assign_credit(verified, records, CreditConfig(kinds=("gdpo", "mc")), progress=False)
    writer = RunWriter(str(folder))
    writer.start("run", {"model": str(DEFAULT_POLICY), "credit": {"kinds": ["gdpo", "mc"]}}, "tree", "test")
    writer.write_shard(0, {"responses": responses_table(annotated, 0),
                           "credits": credits_table(annotated, records, tokenizer)}, stats=stats)
    writer.finish(1, {})
    return str(folder), annotated


def test_mc_is_stored_read_exported_and_trained_on_by_name(tokenizer, tmp_path):
    run, annotated = write_tree_run(tmp_path / "run", tokenizer)
    scale, shift = batch_statistics(torch.tensor([a.gdpo_sum for a in annotated]),
                                    torch.ones(len(annotated), dtype=torch.bool))
    rows = {r["response_id"]: r for r in read_training(run, "mc")}
    for a in annotated:
        expected = scale * (torch.tensor(a.credit.mc_sum, dtype=torch.float64) - shift)
        assert rows[a.verified.sample.response_id]["advantages"] == pytest.approx(expected.tolist(), abs=1e-5)
    gdpo_rows = {r["response_id"]: r["advantages"] for r in read_training(run, "gdpo")}
    assert any(rows[r]["advantages"] != gdpo_rows[r] for r in rows)  # a column of its own

    con = connect(run)
    stored = con.execute("SELECT response_id, constraint_index, list(mc ORDER BY position), "
                         "any_value(relevance_source) FROM credits GROUP BY ALL ORDER BY ALL").fetchall()
    by_id = {a.verified.sample.response_id: a.credit for a in annotated}
    assert len(stored) == 8
    for response_id, k, values, source in stored:
        assert values == pytest.approx(by_id[response_id].mc[k], abs=1e-6) and source == "rollout"
    assert con.execute("SELECT count(*) FROM training WHERE adv_mrtpo IS NULL AND adv_mc IS NOT NULL "
                       "AND sft_weight = list_transform(adv_mc, lambda a: greatest(a, 0.0)::FLOAT)").fetchone()[0] == 4

    dest = export_hf(run, tmp_path / "hf", advantage="mc")
    exported = {r["response_id"]: r["advantages"] for r in pq.read_table(dest / "train.parquet").to_pylist()}
    assert all(exported[r] == pytest.approx(rows[r]["advantages"], abs=1e-6) for r in rows)

    out = tmp_path / "trained"
    train(TrainConfig(data=run, out=str(out), advantage="mc", model=str(DEFAULT_POLICY), steps=1, batch_size=4,
                      lr=1e-3, save_every=100))
    with open(out / "metrics.csv") as f:
        metrics = list(csv.DictReader(f))
    tokens = sum(len(r["token_ids"]) for r in rows.values())
    mean_mc = sum(sum(r["advantages"]) for r in rows.values()) / tokens
    assert int(metrics[0]["tokens"]) == tokens  # the one step saw every response
    assert float(metrics[0]["mean_advantage"]) == pytest.approx(mean_mc, rel=1e-4, abs=1e-6)
    trained, base = load_file(out / "final" / "model.safetensors"), load_file(DEFAULT_POLICY / "model.safetensors")
    assert any(not torch.equal(trained[k], v) for k, v in base.items())


# --- options ------------------------------------------------------------------------------------


def test_credit_option_and_config_accept_mc():
    parser = cli.build_parser()
    assert parser.parse_args(["annotate", "--out", "x", "--credit", "gdpo,mc"]).credit == ("gdpo", "mc")
    assert parser.parse_args(["annotate", "--out", "x", "--credit", "mc"]).credit == ("gdpo", "mc")
    assert CreditConfig(kinds=("gdpo", "mc")).kinds == ("gdpo", "mc")
    with pytest.raises(ValueError, match="gdpo included"):
        CreditConfig(kinds=("mc",))
    assert parser.parse_args(["train", "--data", "d", "--out", "o", "--advantage", "mc:0.5,gdpo:0.5"])


def test_trls_online_trainer_refuses_mc_for_it_samples_flat_groups():
    from tokencredit.pipeline.integrations.trl import MRTPOTrainer

    with pytest.raises(ValueError, match=rf"MRTPOTrainer: {re.escape(NEEDS_TREE)}"):
        MRTPOTrainer(model=None, records=[], credit=CreditConfig(kinds=("gdpo", "mc")), advantage="gdpo")
