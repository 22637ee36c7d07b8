"""Build the tiny default models that ship in `pipeline/models/` (CPU only, deterministic, no downloads).

    python -m tokencredit.pipeline.models.tiny tokenizer|policy|reward-model|pass-rates|all

  tokenizer     byte-level BPE trained on the demo prompts, responses, corruptions and feedback;
  policy        a ~2M-parameter Llama trained with `token_weighted_sft_loss` on the examples of
                `tokencredit.pipeline.train.feedback_training` (train split only), so that it reads verifier feedback;
  reward-model  a smaller Llama sequence classifier trained on the policy's own samples (temperature
                1.0) to predict "every reward passes" (BCE with logits; the score is a logit);
  pass-rates    samples the shipped policy at temperature 1.0 and prints per-task, per-reward pass
                rates on both splits and the reward model's held-out AUC.

Everything is seeded (`SEED`) and runs on one torch thread; rerunning gives the same weights with the
same torch build.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (GenerationConfig, LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification,
                          PreTrainedTokenizerFast)

from tokencredit import verifiers
from tokencredit.schemas.records import TaskRecord

from tokencredit.pipeline.train.feedback_training import Example, Recipe, build_examples, tokenizer_corpus
from tokencredit.pipeline.train.losses import IGNORE_INDEX, token_weighted_sft_loss
from tokencredit.pipeline.models.loading import DEFAULT_POLICY, DEFAULT_REWARD_MODEL
from tokencredit.pipeline.sample.prompts import sampling_prompt

SEED = 20261202
VOCAB_SIZE = 3000
PAD, EOS = "<pad>", "<eos>"
# A space may lead one punctuation mark or one digit; each stands alone, so `>=` is `>` `=` and
# numbers are spelled digit by digit (a changed number differs in one token, not a whole new one).
SPLIT = Regex(r" ?[^\w\s]| ?\d")
TAG = r"</?[a-z_]+>"  # response tags such as <sql>, kept whole


# ------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: Sequence[str], tags: Sequence[str], vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """Byte-level BPE over `texts`; `tags` (e.g. "<sql>") become single tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(SPLIT, "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, EOS], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS)
    fast.add_tokens(sorted(set(tags)))
    fast.model_max_length = 512
    return fast


def response_tags(records: Sequence[TaskRecord]) -> list[str]:
    return sorted({t for r in records for t in re.findall(TAG, r.reference_response)})


# ------------------------------------------------------------------------- training data as tensors


def encode_example(tokenizer, ex: Example) -> tuple[list[int], list[int], list[float]]:
    """(input ids, labels, weights): prompt ids (unlabelled) + response ids + eos, each length L.

    Prompt and response are tokenized separately, as the sampler and the replay do.
    """
    prompt = tokenizer(ex.prompt)["input_ids"]
    enc = tokenizer(ex.response, return_offsets_mapping=True)
    resp = enc["input_ids"] + [tokenizer.eos_token_id]
    spans = enc["offset_mapping"] + [(len(ex.response), len(ex.response) + 1)]
    weights = [0.0 if (s < ex.zero_end and e > ex.zero_start) else 1.0 for s, e in spans]
    return prompt + resp, [IGNORE_INDEX] * len(prompt) + resp, [0.0] * len(prompt) + weights


def collate(rows: Sequence[tuple[list[int], list[int], list[float]]], pad_id: int):
    """Left-padded LongTensor ids [B, L], labels [B, L], float weights [B, L], attention mask [B, L].

    Left padding puts every response at the end, so only the last positions need logits. Llama's
    rotary embeddings are relative, so the shifted positions of a left-padded row change nothing.
    """
    L = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), L), pad_id)
    labels = torch.full((len(rows), L), IGNORE_INDEX)
    weights = torch.zeros(len(rows), L)
    mask = torch.zeros(len(rows), L, dtype=torch.long)
    for b, (i, lab, w) in enumerate(rows):
        n = len(i)
        ids[b, L - n:], labels[b, L - n:], weights[b, L - n:], mask[b, L - n:] = (
            torch.tensor(i), torch.tensor(lab), torch.tensor(w), 1)
    return ids, labels, weights, mask


def tail_loss(model, ids, labels, weights, mask):
    """token_weighted_sft_loss with logits for the last positions only: the longest labelled tail
    plus one (the position that predicts its first token)."""
    labelled = (labels != IGNORE_INDEX).any(0).nonzero()
    keep = ids.shape[1] - int(labelled[0]) + 1
    logits = model(ids, attention_mask=mask, logits_to_keep=keep).logits
    return token_weighted_sft_loss(logits, labels[:, -keep:], weights[:, -keep:])


def lr_at(step: int, steps: int, lr: float, warmup: int = 50) -> float:
    """Linear warmup, then cosine decay to 10% of `lr`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    u = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * u)))


def batches(lengths: Sequence[int], batch_size: int, steps: int, rng: random.Random):
    """`steps` index batches over repeated shuffled epochs; within windows of 16 batches the
    examples are sorted by length, so that a batch wastes little compute on padding."""
    window = 16 * batch_size
    queue: list[list[int]] = []
    for _ in range(steps):
        if not queue:
            order = list(range(len(lengths)))
            rng.shuffle(order)
            for w in range(0, len(order), window):
                chunk = sorted(order[w:w + window], key=lambda i: lengths[i])
                queue += [chunk[b:b + batch_size] for b in range(0, len(chunk), batch_size)]
            rng.shuffle(queue)
        yield queue.pop()


# ------------------------------------------------------------------------- policy


def policy_config(tokenizer) -> LlamaConfig:
    return LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                       tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                       eos_token_id=tokenizer.eos_token_id, bos_token_id=None)


def train_policy(tokenizer, examples: Sequence[Example], steps: int, batch_size: int = 32, lr: float = 2e-3,
                 seed: int = SEED, log_every: int = 100) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(policy_config(tokenizer))
    rows = [encode_example(tokenizer, ex) for ex in examples]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    model.train()
    start = time.time()
    for step, idx in enumerate(batches([len(r[0]) for r in rows], batch_size, steps, random.Random(seed))):
        ids, labels, weights, mask = collate([rows[i] for i in idx], tokenizer.pad_token_id)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr)
        loss = tail_loss(model, ids, labels, weights, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % log_every == 0 or step == steps - 1:
            print(f"  policy step {step:5d}/{steps}  loss {loss.item():.4f}  {time.time() - start:6.0f}s", flush=True)
    return model.eval()


# ------------------------------------------------------------------------- sampling


def sample_responses(model, tokenizer, records: Sequence[TaskRecord], n: int, seed: int,
                     max_new_tokens: int = 96) -> list[list]:
    """`n` responses per record at temperature 1.0 over the full vocabulary, with the pipeline's sampler."""
    from tokencredit.pipeline.config import SamplingConfig
    from tokencredit.pipeline.sample.transformers_backend import TransformersSampler

    config = SamplingConfig(n=n, max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0, seed=seed, batch_size=64)
    samples = TransformersSampler(model, tokenizer, "tiny-policy", progress=False).sample(records, config)
    return [samples[i * n:(i + 1) * n] for i in range(len(records))]


def score_table(records: Sequence[TaskRecord], samples: Sequence[Sequence]) -> list[tuple[TaskRecord, list[int], list[float]]]:
    """(record, response token ids as sampled, eos included; the verifier's scores) per sample."""
    return [(r, y.token_ids, [s.score for s in verifiers.verify(r, y.response)]) for r, ys in zip(records, samples)
            for y in ys]


def pass_rates(scored) -> dict[str, dict[str, float]]:
    """{"task/split": {reward: pass rate, "all": every reward passes}} from `score_table` rows."""
    sums: dict[str, dict[str, list[float]]] = {}
    for r, _, scores in scored:
        row = sums.setdefault(f"{r.task}/{r.split}", {})
        for name, s in zip(verifiers.reward_names(r), scores):
            # instruction rewards are named c{index}_{kind}: pool them by kind
            row.setdefault(re.sub(r"^c\d+_", "", name), []).append(float(s >= 1.0))
        row.setdefault("all", []).append(float(all(s >= 1.0 for s in scores)))
    return {key: {k: sum(v) / len(v) for k, v in row.items()} for key, row in sorted(sums.items())}


# ------------------------------------------------------------------------- reward model


def rm_rows(tokenizer, scored) -> list[tuple[list[int], float]]:
    """(sampling prompt ids + response ids, target 1.0 when every reward passes), as P2T feeds the RM."""
    return [(tokenizer(sampling_prompt(r.prompt))["input_ids"] + list(y), float(all(s >= 1.0 for s in sc)))
            for r, y, sc in scored]


def rm_scores(model, tokenizer, rows, batch_size: int = 64) -> list[float]:
    out = []
    with torch.no_grad():
        for b in range(0, len(rows), batch_size):
            ids, mask = _pad_right([r[0] for r in rows[b:b + batch_size]], tokenizer.pad_token_id)
            out += model(ids, attention_mask=mask).logits[:, 0].tolist()
    return out


def _pad_right(seqs: Sequence[list[int]], pad_id: int):
    # The classifier pools the last non-pad token (config.pad_token_id), so padding goes on the right.
    L = max(map(len, seqs))
    ids = torch.full((len(seqs), L), pad_id)
    mask = torch.zeros(len(seqs), L, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, :len(s)], mask[b, :len(s)] = torch.tensor(s), 1
    return ids, mask


def train_reward_model(policy, tokenizer, rows, steps: int, batch_size: int = 32, lr: float = 5e-4,
                       seed: int = SEED) -> LlamaForSequenceClassification:
    """A sequence classifier whose backbone starts as the policy's: the policy already knows what the
    train prompts' responses should be, so the head learns "does this response deviate" quickly."""
    torch.manual_seed(seed)
    config = LlamaConfig(**{**policy.config.to_dict(), "num_labels": 1, "architectures": None})
    model = LlamaForSequenceClassification(config)
    model.model.load_state_dict(policy.model.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    model.train()
    for step, idx in enumerate(batches([len(r[0]) for r in rows], batch_size, steps, random.Random(seed))):
        ids, mask = _pad_right([rows[i][0] for i in idx], tokenizer.pad_token_id)
        target = torch.tensor([rows[i][1] for i in idx])
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(ids, attention_mask=mask).logits[:, 0], target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"  reward model step {step:5d}/{steps}  bce {loss.item():.4f}", flush=True)
    return model.eval()


def auc(scores: Sequence[float], labels: Sequence[float]) -> float:
    """Probability that a positive outranks a negative (ties count half); nan without both classes."""
    pos = [s for s, y in zip(scores, labels) if y >= 0.5]
    neg = [s for s, y in zip(scores, labels) if y < 0.5]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


# ------------------------------------------------------------------------- build steps and CLI

POLICY_STEPS = 1800
RM_SAMPLES_PER_PROMPT = 4
RM_STEPS = 300
CARD_FIELDS = ("seed", "build_seconds", "parameters", "vocab_size", "train_records", "examples", "steps")


def demo_records() -> list[TaskRecord]:
    records, rejected = verifiers.load_tasks("demo")
    if rejected:
        raise ValueError(f"demo set has bad lines: {rejected[0].reason}")
    return records


def build_policy(out: Path = DEFAULT_POLICY, steps: int = POLICY_STEPS, recipe: Recipe = Recipe()) -> dict:
    """Tokenizer + policy from the demo train split; writes `out` and returns the build facts."""
    start = time.time()
    torch.use_deterministic_algorithms(True)
    records = demo_records()
    tokenizer = train_tokenizer(list(tokenizer_corpus(records, SEED)), response_tags(records))
    examples = build_examples(records, SEED, recipe)
    model = train_policy(tokenizer, examples, steps)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=96,
                                               eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    facts = {"seed": SEED, "build_seconds": round(time.time() - start), "parameters": model.num_parameters(),
             "vocab_size": len(tokenizer), "train_records": sum(r.split == "train" for r in records),
             "examples": len(examples), "steps": steps}
    (out / "build.json").write_text(json.dumps(facts, indent=1) + "\n")
    return facts


def sample_and_score(policy, tokenizer, records: Sequence[TaskRecord], n: int, seed: int):
    return score_table(records, sample_responses(policy, tokenizer, records, n, seed))


def build_reward_model(out: Path = DEFAULT_REWARD_MODEL, policy_dir: Path = DEFAULT_POLICY,
                       steps: int = RM_STEPS) -> dict:
    """Reward model on the shipped policy's samples for the train prompts; held-out AUC on test prompts."""
    from tokencredit.pipeline.models.loading import load_policy

    start = time.time()
    torch.use_deterministic_algorithms(True)
    policy, tokenizer = load_policy(policy_dir)
    records = demo_records()
    train = [r for r in records if r.split == "train"]
    rows = rm_rows(tokenizer, sample_and_score(policy, tokenizer, train, RM_SAMPLES_PER_PROMPT, SEED))
    model = train_reward_model(policy, tokenizer, rows, steps)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.padding_side = "right"
    tokenizer.save_pretrained(out)
    facts = {"seed": SEED, "build_seconds": round(time.time() - start), "parameters": model.num_parameters(),
             "train_samples": len(rows), "train_positive_rate": round(sum(r[1] for r in rows) / len(rows), 3),
             "steps": steps}
    (out / "build.json").write_text(json.dumps(facts, indent=1) + "\n")
    return facts


def measure(policy_dir: Path = DEFAULT_POLICY, rm_dir: Path = DEFAULT_REWARD_MODEL, n: int = 8) -> dict:
    """Pass rates at temperature 1.0 (n samples per prompt, both splits) and the RM's AUC on test samples."""
    from tokencredit.pipeline.models.loading import load_policy, load_reward_model

    policy, tokenizer = load_policy(policy_dir)
    scored = sample_and_score(policy, tokenizer, demo_records(), n, SEED + 1)
    rm, rm_tokenizer = load_reward_model(rm_dir)
    test = [row for row in scored if row[0].split == "test"]
    rows = rm_rows(rm_tokenizer, test)
    by_task = {}
    for task in sorted({r.task for r, _, _ in test}):
        idx = [i for i, row in enumerate(test) if row[0].task == task]
        sub = [rows[i] for i in idx]
        by_task[task] = auc(rm_scores(rm, rm_tokenizer, sub), [r[1] for r in sub])
    all_scores = rm_scores(rm, rm_tokenizer, rows)
    return {"samples_per_prompt": n, "pass_rates": pass_rates(scored),
            "rm_test_auc": auc(all_scores, [r[1] for r in rows]), "rm_test_auc_by_task": by_task}


def format_pass_rates(result: dict) -> str:
    """Markdown: one table per task/split, reward -> pass rate, then the RM's held-out AUC."""
    lines = [f"Pass rate = share of samples (temperature 1.0, full vocabulary, {result['samples_per_prompt']} "
             "per prompt) whose reward scores 1.0; `all` = every reward passes.", ""]
    for key, row in result["pass_rates"].items():
        lines.append(f"- `{key}`: " + ", ".join(f"{name} {rate:.2f}" for name, rate in row.items()))
    by_task = ", ".join(f"{t} {a:.3f}" for t, a in result["rm_test_auc_by_task"].items())
    lines += ["", f"Reward model AUC on test-split samples (target: every reward passes): "
                  f"{result['rm_test_auc']:.3f} ({by_task})."]
    return "\n".join(lines)


POLICY_CARD = """# tokencredit tiny policy

A {parameters:,}-parameter `LlamaForCausalLM` (hidden 128, 4 layers, 4 heads, tied embeddings, vocab
{vocab_size}: byte-level BPE with `<pad>`, `<eos>` and the response tags as single tokens), the default
policy of `tokencredit annotate`. It only knows the bundled demo tasks (`verifiers/demo`: SQL, tool calls,
instruction following) and exists so that the pipeline runs on a CPU with no download.

Built by `python -m tokencredit.pipeline.models.tiny all` (seed {seed}, CPU, {build_seconds} s for this step) from the
{train_records} train-split records only, {examples} examples, {steps} AdamW steps of 32 with
`tokencredit.pipeline.train.losses.token_weighted_sft_loss` (loss on response tokens and eos). The examples
(`pipeline/train/feedback_training.py`) teach it to read verifier feedback laid out by `tokencredit.pipeline.sample.prompts`
(template `{template}`): sampling prompt -> reference or a corruption; every feedback section present ->
the reference (also on records whose reference was swapped for a corruption, so that the feedback, not
the question, decides); section k removed -> half the time a corruption of the part reward k governs. So
MRTPO's leave-one-out replay distance for reward k concentrates on the kind of tokens that reward checks
(see bench/RESULTS.md: Figure 6 shares, and Localization for how often it singles out the one wrong token
of a hand-made response: above chance, not reliably).
"""

RM_CARD = """# tokencredit tiny reward model

`LlamaForSequenceClassification` (one output, a logit; `pad_token_id` set so the last non-pad token is
pooled), same tokenizer and backbone shape as the tiny policy, initialised from the policy's backbone.
Trained (seed {seed}, {steps} steps, BCE with logits) on {train_samples} responses that the tiny
policy sampled at temperature 1.0 for the demo train-split prompts, laid out as `sampling_prompt(prompt)`
followed by the sampled token ids (eos included); target 1 when every reward of the verifiers passes
(positive rate {train_positive_rate}). The default reward model for P2T in `tokencredit annotate`.
"""


def results_section(result: dict) -> str:
    policy = json.loads((DEFAULT_POLICY / "build.json").read_text())
    rm = json.loads((DEFAULT_REWARD_MODEL / "build.json").read_text())
    size = sum(f.stat().st_size for d in (DEFAULT_POLICY, DEFAULT_REWARD_MODEL) for f in d.iterdir()) / 2**20
    return "\n".join([
        "## Tiny models", "",
        f"Built by `python -m tokencredit.pipeline.models.tiny all` (seed {SEED}, CPU): policy {policy['parameters']:,} "
        f"parameters in {policy['build_seconds']} s, reward model in {rm['build_seconds']} s; "
        f"{size:.1f} MiB on disk in all. Figures from `python -m tokencredit.pipeline.models.tiny pass-rates`.", "",
        format_pass_rates(result), ""])


def write_reports(result: dict, results_md: Path = Path("bench/RESULTS.md")) -> None:
    """Model cards in both model folders and the `## Tiny models` section of bench/RESULTS.md."""
    from tokencredit.pipeline.sample.prompts import TEMPLATE_VERSION

    facts = json.loads((DEFAULT_POLICY / "build.json").read_text())
    (DEFAULT_POLICY / "README.md").write_text(POLICY_CARD.format(**facts, template=TEMPLATE_VERSION)
                                              + "\n## Pass rates\n\n" + format_pass_rates(result) + "\n")
    facts = json.loads((DEFAULT_REWARD_MODEL / "build.json").read_text())
    (DEFAULT_REWARD_MODEL / "README.md").write_text(RM_CARD.format(**facts) + "\n## Held-out score\n\n"
                                                    + format_pass_rates(result).split("\n")[-1] + "\n")
    text = results_md.read_text() if results_md.exists() else "# Benchmark results\n"
    section, start = results_section(result), text.find("## Tiny models")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:  # replace our section only, up to the next `## ` heading
        end = text.find("\n## ", start + 1)
        text = text[:start] + section + ("\n" + text[end + 1:] if end >= 0 else "")
    results_md.write_text(text)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tokencredit.pipeline.models.tiny", description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["policy", "reward-model", "pass-rates", "all"])
    parser.add_argument("--samples", type=int, default=8, help="pass-rates: samples per prompt")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # float sums depend on the thread count: one thread, the same files anywhere
    if args.what in ("policy", "all"):
        print("policy:", build_policy(), flush=True)
    if args.what in ("reward-model", "all"):
        print("reward model:", build_reward_model(), flush=True)
    if args.what in ("pass-rates", "all"):
        result = measure(n=args.samples)
        print(format_pass_rates(result))
        write_reports(result)


if __name__ == "__main__":
    main()
