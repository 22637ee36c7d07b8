"""`--locate`: MRTPO's relevance from the verifier's spans, the replay, or both (method.md section 2).

Real components: the shipped tiny policy replays, the instruction verifier gives the spans."""
from __future__ import annotations

import pytest
import torch

from tokencredit.pipeline.annotate import AnnotateConfig, run_annotation, verify_samples
from tokencredit.pipeline.credit.assign import CreditConfig, assign_credit
from tokencredit.pipeline.models.loading import load_policy
from tokencredit.pipeline.dataset.query import connect
from tokencredit.pipeline.config import SamplingConfig
from tokencredit.pipeline.sample.rows import render_prompt
from tokencredit.pipeline.sample.detokenize import token_spans
from tokencredit.schemas.records import Constraint, InstructionSpec, Sample, TaskRecord

RESPONSES = ["Rain falls, then, it stops", "Rain falls and then it stops", "Rain, falls and it stops now",
             "Rain falls softly and stops"]


@pytest.fixture(scope="module")
def policy():
    return load_policy(None)


def verified_group(tokenizer):
    """One record (no commas, at most 5 words), four hand-written responses of it, verified."""
    spec = InstructionSpec((Constraint("no_commas", {}), Constraint("word_count", {"max": 5})))
    record = TaskRecord("rain", "instructions", "Describe rain.", None, spec)
    prompt = render_prompt(tokenizer, record.prompt)
    samples = []
    for j, text in enumerate(RESPONSES):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        samples.append(Sample(f"rain/{j}", "rain", "instructions", prompt[0], prompt[1], tokenizer.decode(ids), ids,
                              [0.0] * len(ids), "tiny", 0))
    return verify_samples(samples, {"rain": record}), {"rain": record}


def credit(policy, locate: str, beta: float = 0.5):
    model, tokenizer = policy
    verified, records = verified_group(tokenizer)
    config = CreditConfig(locate=locate, beta=beta)
    return assign_credit(verified, records, config, model, tokenizer, progress=False)


def test_both_skips_the_replay_where_the_verifier_locates(policy):
    replay_only, replay_stats = credit(policy, "replay")
    both, both_stats = credit(policy, "both")
    sources = [a.credit.relevance_source for a in both]
    # the comma responses (0, 2) are penalized on no_commas and located there; 1 and 3 pass it: replayed
    assert [s[0] for s in sources] == ["verifier", "replay", "verifier", "replay"]
    assert both_stats["verifier_located"] == sum(s.count("verifier") for s in sources) >= 2
    assert both_stats["replays_done"] == replay_stats["replays_done"] - both_stats["verifier_located"]
    assert both_stats["tokens_replayed"] < replay_stats["tokens_replayed"]
    assert all(s == ["replay"] * 2 for s in (a.credit.relevance_source for a in replay_only))
    # a pair the replay did not touch under `both` has the very values of the replay-only run
    for a, b, s in zip(replay_only, both, sources):
        for k, source in enumerate(s):
            if source == "replay":
                assert b.credit.distance[k] == pytest.approx(a.credit.distance[k], abs=1e-5)


def test_verifier_relevance_is_one_on_the_tokens_of_the_spans(policy):
    _, tokenizer = policy
    annotated, stats = credit(policy, "verifier")
    assert stats["replays_done"] == 0
    first = annotated[0]
    texts, starts, ends = token_spans(tokenizer, first.verified.sample.token_ids)
    commas = [t for t, (s, e) in enumerate(zip(starts, ends)) if "," in first.verified.sample.response[s:e]]
    d = first.credit.distance[0]
    assert [t for t, x in enumerate(d) if x == 1.0] == commas and set(d) == {0.0, 1.0}
    weights = torch.tensor(first.credit.weight[0])
    assert weights.mean().item() == pytest.approx(1.0) and weights[commas].min() > weights.max() / 2
    # a response the verifier does not locate (no_commas passed: positive advantage) stays uniform
    assert annotated[1].credit.relevance_source[0] == "uniform" and set(annotated[1].credit.weight[0]) == {1.0}


@pytest.mark.parametrize("locate", ["replay", "verifier", "both"])
def test_invariants_hold_for_every_locate_option(policy, locate):
    located, _ = credit(policy, locate, beta=0.7)
    flat, _ = credit(policy, locate, beta=0.0)
    for a, g in zip(located, flat):
        adv, reward_adv = torch.tensor(a.credit.advantage), torch.tensor(a.credit.reward_adv)
        torch.testing.assert_close(adv.mean(-1), reward_adv, atol=1e-6, rtol=0)  # mass preservation
        gdpo = torch.tensor(g.credit.advantage)
        assert torch.equal(gdpo, reward_adv[:, None].expand_as(gdpo))  # beta 0 = GDPO


def test_the_relevance_source_column(tmp_path):
    config = AnnotateConfig(limit=2, tasks=("instructions", "tools"), sampling=SamplingConfig(n=4, max_new_tokens=32))
    run_annotation(config, str(tmp_path / "run"), progress=False)
    con = connect(tmp_path / "run")
    rows = dict(con.execute("SELECT relevance_source, count(DISTINCT (response_id, reward, constraint_index)) "
                        "FROM credits GROUP BY ALL").fetchall())
    assert set(rows) <= {"verifier", "replay", "uniform"} and rows.get("verifier", 0) > 0
    # a verifier-located pair: relevance 1 or 0 on every token, some 1, never floored, no JS
    bad = con.execute("SELECT count(*) FROM (SELECT response_id, reward, constraint_index, "
                  "bool_and(distance IN (0, 1)) AS is_binary, max(distance) AS top, bool_or(floored) AS floored "
                  "FROM credits WHERE relevance_source = 'verifier' GROUP BY ALL) "
                  "WHERE NOT is_binary OR top <> 1 OR floored").fetchone()[0]
    assert bad == 0
    assert con.execute("SELECT count(*) FROM credits WHERE relevance_source = 'uniform' AND distance IS NOT NULL"
                   ).fetchone()[0] == 0


@pytest.mark.parametrize("locate", ["replay", "both"])
def test_the_token_advantage_is_linear_in_beta(policy, locate):
    # bench/compare_designs/hypotheses.toml trains MRTPO at beta 1 from a beta-0.5 run as 2 A_mrtpo - A_gdpo (beta 0):
    # this is why
    at = {beta: credit(policy, locate, beta)[0] for beta in (0.0, 0.5, 1.0)}
    for zero, half, one in zip(at[0.0], at[0.5], at[1.0]):
        assert torch.tensor(one.credit.mrtpo_sum) == pytest.approx(
            2 * torch.tensor(half.credit.mrtpo_sum) - torch.tensor(zero.credit.mrtpo_sum), abs=1e-5)
        assert torch.tensor(zero.credit.mrtpo_sum) == pytest.approx(torch.full((len(zero.credit.mrtpo_sum),),
                                                                               zero.gdpo_sum), abs=1e-5)
