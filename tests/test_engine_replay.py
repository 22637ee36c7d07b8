"""MRTPO's replay through the vLLM engine (`credit.engine_replay`) against the torch replay, on SmolLM2 and the
localization benchmark's responses; runs where vllm imports (the README's environment) and SmolLM2 is pulled."""
import pytest
import torch

from tokencredit.pipeline.models.registry import is_pulled

NAME = "smollm2-135m-instruct"
pytestmark = [pytest.mark.vllm, pytest.mark.real,
              pytest.mark.skipif(not is_pulled(NAME), reason=f"run `tokencredit models pull {NAME}` first")]
vllm = pytest.importorskip("vllm")

# Bound from measurement: the engine in float32 against the torch replay in float32, over the response tokens after
# P_all and every P_\k (bench/bench_engine.py's replay check, engine_replay_max_abs_logprob_diff_fp32 in
# engine.json): max |difference| 3.6e-5 over 596 tokens of 5 localization responses at load 13. The bound leaves
# about 5x for other responses and machines.
LOGPROB_BOUND_FP32 = 2e-4


@pytest.fixture(scope="module")
def engines():
    """(torch policy, tokenizer, vLLM sampler in float32): one engine for the module."""
    from tokencredit.pipeline.models.loading import load_policy
    from tokencredit.pipeline.sample import make_sampler, release_sampler

    torch.set_num_threads(2)
    model, tokenizer = load_policy(NAME)
    # make_sampler: the process's one engine (another engine in the session stops this one before it starts)
    sampler = make_sampler("vllm", NAME, device="cpu", dtype="float32")
    sampler.progress = False
    yield model, tokenizer, sampler
    release_sampler(sampler)


@pytest.fixture(scope="module")
def items(engines, bench_module):
    return bench_module("bench_engine").replay_cases(engines[1], every=8)  # 21 of the 164 responses


def test_engine_log_probs_match_the_torch_replay_in_float32(engines, items):
    from tokencredit.pipeline.credit.engine_replay import engine_replay
    from tokencredit.pipeline.credit.replay import ReplayStats, replay

    model, _, sampler = engines
    replay_items, _ = items
    stats = ReplayStats()
    engine, reference = engine_replay(sampler, replay_items, stats=stats), replay(model, replay_items)
    assert stats.replays_done == sum(len(it.drop_prompt_ids) for it in replay_items)
    for item, a, b in zip(replay_items, reference, engine):
        assert b.js is None and b.logprob_all.shape == (len(item.response_ids),)
        assert not torch.isnan(b.logprob_drop).any()
        assert (a.logprob_all - b.logprob_all).abs().max() <= LOGPROB_BOUND_FP32
        assert (a.logprob_drop - b.logprob_drop).abs().max() <= LOGPROB_BOUND_FP32


def test_gated_rewards_and_identical_prompts_as_the_torch_replay(engines, items):
    """A gated reward stays NaN, a P_\\k equal to P_all gives q = p exactly, an empty response is not sent."""
    from tokencredit.pipeline.credit.engine_replay import engine_replay
    from tokencredit.pipeline.credit.replay import ReplayItem

    _, _, sampler = engines
    item = items[0][0]
    K = len(item.drop_prompt_ids)
    gated = ReplayItem(item.all_prompt_ids, [None] + item.drop_prompt_ids[1:], item.response_ids)
    same = ReplayItem(item.all_prompt_ids, [list(item.all_prompt_ids)] * K, item.response_ids)
    empty = ReplayItem(item.all_prompt_ids, item.drop_prompt_ids, [])
    out_gated, out_same, out_empty = engine_replay(sampler, [gated, same, empty])
    assert torch.isnan(out_gated.logprob_drop[0]).all() and not torch.isnan(out_gated.logprob_drop[1:]).any()
    assert torch.equal(out_same.logprob_drop, out_same.logprob_all.expand(K, -1))
    assert out_empty.logprob_all.shape == (0,)


def test_assign_credit_replays_the_default_relevance_through_the_engine(engines):
    """`assign_credit(..., replay_engine=sampler)` gives the torch replay's relevance within the float32 bound
    (the default relevance, `logprob_signed`; JS still goes to torch)."""
    from tokencredit.pipeline.config import SamplingConfig
    from tokencredit.pipeline.credit.assign import CreditConfig, assign_credit
    from tokencredit.pipeline.annotate import AnnotateConfig, load_prompt_set, verify_samples

    model, tokenizer, sampler = engines
    records, _ = load_prompt_set(AnnotateConfig(model=NAME, tasks=("instructions",), limit=4))
    samples = sampler.sample(records, SamplingConfig(n=4, max_new_tokens=48))
    by_id = {r.id: r for r in records}
    verified = verify_samples(samples, by_id)
    config = CreditConfig(kinds=("gdpo", "mrtpo"), locate="replay")  # every ungated pair replayed
    assert config.relevance == "logprob_signed"
    on_torch, torch_stats = assign_credit(verified, by_id, config, model, tokenizer, progress=False)
    on_engine, engine_stats = assign_credit(verified, by_id, config, None, tokenizer, progress=False,
                                            replay_engine=sampler)
    assert engine_stats["replays_done"] == torch_stats["replays_done"] > 0
    for a, b in zip(on_torch, on_engine):
        if a.credit is None:
            continue
        assert a.credit.relevance_source == b.credit.relevance_source
        for ra, rb in zip(a.credit.distance, b.credit.distance):
            assert (ra is None) == (rb is None)
            if ra is not None:
                assert max(abs(x - y) for x, y in zip(ra, rb)) <= 2 * LOGPROB_BOUND_FP32


def test_each_position_is_computed_once_and_read_back_only_where_computed(engines, items):
    """Reading the prefix cache: a P_\\k reuses the prompt it shares with P_all, so the engine computes about the
    distinct positions the sequences hold (not their sum); a response whose every position was read from blocks an
    earlier call computed is asked again, and its log-probs still match the torch replay."""
    from tokencredit.pipeline.credit.engine_replay import engine_replay
    from tokencredit.pipeline.credit.replay import ReplayItem, ReplayStats, replay, replayed_sequences

    model, _, sampler = engines
    replay_items = items[0][:6]
    stats = ReplayStats()
    assert sampler.llm.reset_prefix_cache()  # what the tests before left there
    engine_replay(sampler, replay_items, stats=stats)
    sequences, _ = replayed_sequences(replay_items)
    assert stats.tokens_forwarded + stats.tokens_from_cache == sum(map(len, sequences))
    assert stats.tokens_forwarded <= 1.25 * stats.positions_min < sum(map(len, sequences))
    # the same items again: every block is cached now; a P_all whose response lies in cached blocks is recomputed
    again = ReplayStats()
    twice = engine_replay(sampler, replay_items, stats=again)
    assert again.tokens_from_cache > 0 and again.sequences_forwarded > len(sequences)
    # two items sharing P_all and a long response prefix, then apart: the second reads the first's blocks
    item = replay_items[0]
    longer = ReplayItem(item.all_prompt_ids, item.drop_prompt_ids, item.response_ids + item.response_ids[:8])
    for a, b in zip(replay(model, [*replay_items, longer]), [*twice, *engine_replay(sampler, [longer])]):
        assert (a.logprob_all - b.logprob_all).abs().max() <= LOGPROB_BOUND_FP32
        assert (a.logprob_drop - b.logprob_drop).abs().max() <= LOGPROB_BOUND_FP32
