"""SmolLM2 runs of the closed-loop train prompts, one per `--locate`, sharing one sample and verification.

    python bench/own_runs.py --out bench/.own [--limit 48] [--n 4]

Sampling and verifying once, then crediting the same verified responses under each locate option (replay,
verifier, both) writes the runs `OUT/replay`, `OUT/verifier`, `OUT/both` whose responses are identical: only
the credit differs (the bench compares credits on the same pairs). With `--reward-model DIR` (e.g. one
`tokencredit rm train` wrote) the replay run also holds P2T's credit, as bench_repair.py's own replay run does.
Each run's manifest records its own config, so `tokencredit values OUT/both` reads the sampling settings the
responses were drawn with. A run already complete under OUT is kept. `make_tree_run` writes `OUT/tree`: the same
prompts and settings sampled as trees (`--tree R,L`) and credited gdpo,mc, for the Monte-Carlo credit, which needs
tree-sampled groups.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from common import ROOT  # noqa: F401  (also sets torch threads)

LOCATES = ("replay", "verifier", "both")
PROMPTS = ROOT / "bench" / "closed_loop_prompts" / "prompts.jsonl"


def config_for(args, locate: str):
    from tokencredit.pipeline.config import AnnotateConfig, CreditConfig, SamplingConfig

    return AnnotateConfig(prompts=str(args.prompts), tasks=("instructions",), split="train", limit=args.limit,
                          model=args.model, backend=args.backend, sampling=SamplingConfig(n=args.n, max_new_tokens=args.max_new_tokens,
                                                                    temperature=args.temperature, seed=args.seed),
                          reward_model=args.reward_model if locate == "replay" else None,
                          credit=CreditConfig(kinds=("gdpo", "mrtpo", "p2t") if locate == "replay" and args.reward_model
                                              else ("gdpo", "mrtpo"), locate=locate))


def make_tree_run(args) -> str:
    """OUT/tree: the prompts sampled as trees of `args.tree` branching, credited gdpo,mc (kept when complete)."""
    import dataclasses

    from tokencredit.pipeline.config import CreditConfig
    from tokencredit.pipeline.steps import Pipeline

    path = Path(args.out) / "tree"
    if not (path / "manifest.json").exists():
        flat = config_for(args, "replay")
        config = dataclasses.replace(flat, reward_model=None, credit=CreditConfig(kinds=("gdpo", "mc")),
                                     sampling=dataclasses.replace(flat.sampling, n=None, tree=args.tree))
        Pipeline(config).run(str(path))
        print(f"wrote {path}", flush=True)
    return str(path)


def make_runs(args) -> dict[str, str]:
    from tokencredit.pipeline.steps import Pipeline

    out = Path(args.out)
    paths = {locate: str(out / locate) for locate in LOCATES}
    todo = [loc for loc in LOCATES if not (out / loc / "manifest.json").exists()]
    if not todo:
        return paths
    first = Pipeline(config_for(args, todo[0]))
    records, rejected = first.load()
    samples = first.sample(records)
    print(f"sampled {len(samples)} responses of {len(records)} prompts", flush=True)
    verified = first.verify(records, samples)
    for locate in todo:
        pipe = Pipeline(config_for(args, locate))
        pipe.__dict__["models"] = first.models  # one policy in memory for every run
        pipe.write(paths[locate], records, pipe.credit(records, verified), rejected)
        print(f"wrote {paths[locate]}", flush=True)
    return paths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", default=str(PROMPTS))
    parser.add_argument("--limit", type=int, default=48, help="train prompts (default 48)")
    parser.add_argument("--n", type=int, default=4, help="responses per prompt")
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tree", type=lambda text: tuple(int(x) for x in text.split(",")), default=(4, 2),
                        help="R,L: the tree run's branching (its groups have R x L leaves)")
    parser.add_argument("--backend", choices=("transformers", "vllm"), default="transformers",
                        help="sampler of the runs and of the value curves' continuations (vllm: the CPU engine of "
                        "the README's environment)")
    parser.add_argument("--reward-model", default=None, help="P2T's reward model for the replay run (a folder of "
                        "`tokencredit rm train`); without it the runs hold no P2T")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / ".own"))
    add_arguments(parser)
    make_runs(parser.parse_args())
