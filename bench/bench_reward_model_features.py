"""Why `rm train` misses 0.75: what a linear head on the frozen base can learn, by cross-validation on the
TRAIN prompts only (the held-out prompts are never read).

    python bench/bench_reward_model_features.py --run RUN

For the run `bench_reward_model.py` trains on: the base's hidden state at every third layer, pooled two
ways (the last token, as HF's sequence classifier and so `rm train` pool; the mean over the response's
tokens), each with the L2 strength of `rm train`'s grid that cross-validates best; then a learning curve
(a quarter ... all of each fold's fit prompts, 3 draws) for each pooling's best layer: whether more prompts
would help. Rows of `bench/results/reward_model_features.json`; exploratory (chosen after the held-out
figure of bench_reward_model.py was seen), so no target.
"""
from __future__ import annotations

import argparse
import json
import random

import torch

from common import ROOT, upsert_result  # (common also sets torch threads)

RESULTS_JSON = ROOT / "bench" / "results" / "reward_model_features.json"
FRACTIONS = (0.25, 0.5, 0.75, 1.0)


def layer_features(model, tokenizer, responses, batch_size: int = 8) -> dict[str, torch.Tensor]:
    """{pooling: [N, layers + 1, h]} for each of P2T's poolings ("last": the last non-pad token; "response_mean":
    the mean over the response's tokens): every layer's hidden state pooled by `p2t.pool_weights`."""
    from tokencredit.pipeline.credit.p2t import POOLINGS, encode_for_reward_model, padded_batch, pool_weights

    pad = model.config.pad_token_id
    encoded = [encode_for_reward_model(tokenizer, r.prompt, r.text)[:2] for r in responses]
    out = {pooling: [] for pooling in POOLINGS}
    for start in range(0, len(encoded), batch_size):
        batch = encoded[start:start + batch_size]
        ids, mask, is_response = padded_batch([p for p, _ in batch], [r for _, r in batch], pad)
        with torch.no_grad():
            hidden = torch.stack(model.base_model(input_ids=ids, attention_mask=mask,
                                                  output_hidden_states=True).hidden_states, 1)  # [B, layers+1, L, h]
        for pooling in POOLINGS:
            weights = pool_weights(ids, mask, is_response, pad, pooling)
            out[pooling].append(torch.einsum("blth,bt->blh", hidden.float(), weights))
    return {pooling: torch.cat(found) for pooling, found in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="the annotated run bench_reward_model.py trained on")
    parser.add_argument("--base", default="smollm2-135m-instruct")
    args = parser.parse_args()

    from tokencredit.pipeline.train.reward_model import (L2_GRID, RewardModelConfig, cv_accuracy, load_base,
                                                         make_pairs)

    config = RewardModelConfig(base=args.base)
    pairs = make_pairs(args.run, config)
    train = pairs.split(False)
    model, tokenizer = load_base(config.base)
    features = layer_features(model, tokenizer, pairs.responses)
    rows = []
    for pool, table in features.items():
        for layer in range(0, table.shape[1], 3):
            scores = {l2: cv_accuracy(table[:, layer], train, pairs.responses, config, l2) for l2 in L2_GRID}
            l2 = max(scores, key=scores.get)
            rows.append({"pool": pool, "layer": layer, "l2": l2, "fraction": 1.0, "cv_accuracy": scores[l2]})
            print(f"{pool:>13} layer {layer:2d}: cv accuracy {scores[l2]:.3f} (l2 {l2})", flush=True)
    for pool in features:
        best = max((r for r in rows if r["pool"] == pool), key=lambda r: r["cv_accuracy"])
        for fraction in FRACTIONS[:-1]:
            draws = [cv_accuracy(features[pool][:, best["layer"]], train, pairs.responses, config, best["l2"],
                                 fit_groups=lambda g, d=d: random.Random(d).sample(g, max(2, round(fraction * len(g)))))
                     for d in range(3)]
            rows.append({**best, "fraction": fraction, "cv_accuracy": sum(draws) / len(draws)})
            print(f"{pool:>13} layer {best['layer']:2d}, {fraction:.2f} of the prompts: {rows[-1]['cv_accuracy']:.3f}")
    meta = {"run": args.run, "base": args.base, "pairs_train": len(train),
            "prompts_train": len({pairs.responses[c].group_id for c, _ in train})}
    rows = [{**meta, **r} for r in rows]
    RESULTS_JSON.write_text(json.dumps(rows, indent=1) + "\n")
    record(rows)


def record(rows: list[dict]) -> None:
    """The row of bench/RESULTS.md for `rows` (as written to RESULTS_JSON)."""
    full = [r for r in rows if r["fraction"] == 1.0]
    best = {pool: max((r for r in full if r["pool"] == pool), key=lambda r: r["cv_accuracy"]) for pool in dict.fromkeys(r["pool"] for r in full)}
    final = {pool: max(r["layer"] for r in full if r["pool"] == pool) for pool in best}
    curve = {pool: ", ".join(f"{r['cv_accuracy']:.3f}" for r in sorted(
        (r for r in rows if r["pool"] == pool and r["layer"] == best[pool]["layer"]), key=lambda r: r["fraction"]))
        for pool in best}
    upsert_result(
        "Reward model features (bench_reward_model_features.py)",
        "Exploratory (after the held-out figure of bench_reward_model.py was seen): cross-validated pairwise accuracy "
        "over the TRAIN prompts only of a linear Bradley-Terry head on the frozen base's hidden states, every third "
        "layer, pooled at the last token or averaged over the response; a learning curve over the share of each "
        "fold's prompts; `bench/results/reward_model_features.json`.",
        "full",
        f"{rows[0]['base']}, run {rows[0]['run']} ({rows[0]['prompts_train']} train prompts, {rows[0]['pairs_train']} "
        "train pairs), 4 folds by prompt, L2 from rm train's grid; curve: 3 draws per share",
        "; ".join(f"{pool}: last layer ({final[pool]}) "
                  f"{next(r['cv_accuracy'] for r in full if r['pool'] == pool and r['layer'] == final[pool]):.3f}, "
                  f"best layer {best[pool]['layer']} {best[pool]['cv_accuracy']:.3f}, its curve at 1/4, 1/2, 3/4, all "
                  f"of the prompts {curve[pool]}" for pool in best),
        "none (exploratory)")


if __name__ == "__main__":
    main()
