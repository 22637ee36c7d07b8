import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tokencredit.pipeline.train.losses import IGNORE_INDEX, token_weighted_sft_loss


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=101, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval()


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 101, (3, 12), generator=g)
    labels = ids.clone()
    labels[:, :5] = IGNORE_INDEX  # the prompt
    labels[1, 10:] = IGNORE_INDEX  # padding
    return ids, labels


def test_all_ones_weights_equal_hf_causal_lm_loss():
    model = tiny_llama()
    ids, labels = batch()
    out = model(ids, labels=labels)
    ours = token_weighted_sft_loss(out.logits, labels, torch.ones(labels.shape))
    assert torch.allclose(ours, out.loss, atol=1e-6)


def test_zero_weight_tokens_do_not_contribute():
    model = tiny_llama()
    ids, labels = batch()
    logits = model(ids).logits
    weights = torch.rand(labels.shape, generator=torch.Generator().manual_seed(2)) + 0.5
    weights[0, 7] = 0.0
    base = token_weighted_sft_loss(logits, labels, weights)
    # Changing the zero-weight token's target, or the weight of an ignored position, changes nothing.
    labels2 = labels.clone()
    labels2[0, 7] = (labels[0, 7] + 1) % 101
    weights2 = weights.clone()
    weights2[0, 2] = 100.0
    assert torch.allclose(token_weighted_sft_loss(logits, labels2, weights2), base, atol=1e-6)


def test_weighted_mean_of_per_token_nll():
    model = tiny_llama()
    ids, labels = batch()
    logits = model(ids).logits
    weights = torch.arange(labels.numel(), dtype=torch.float32).view_as(labels) % 3
    logp = torch.log_softmax(logits[:, :-1].float(), -1)
    num = den = 0.0
    for b in range(ids.shape[0]):
        for t in range(1, ids.shape[1]):
            if labels[b, t] != IGNORE_INDEX:
                num -= weights[b, t] * logp[b, t - 1, labels[b, t]]
                den += weights[b, t]
    assert torch.allclose(token_weighted_sft_loss(logits, labels, weights), num / den, atol=1e-5)


def test_gradient_flows_and_zero_total_weight_is_an_error():
    model = tiny_llama()
    ids, labels = batch()
    loss = token_weighted_sft_loss(model(ids).logits, labels, torch.ones(labels.shape))
    loss.backward()
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="sum to zero"):
        token_weighted_sft_loss(model(ids).logits, labels, torch.zeros(labels.shape))
