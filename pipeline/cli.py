"""`tokencredit` command line: annotate, query (more subcommands join as stages land)."""
from __future__ import annotations

import argparse
import json
import sys

from .annotate import AnnotateConfig
from .credit import CREDIT_KINDS, CreditConfig
from .sampling import SamplingConfig


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in CREDIT_KINDS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown credit kind(s) {bad}; choose from {','.join(CREDIT_KINDS)}")
    return kinds if "gdpo" in kinds else ("gdpo", *kinds)


def add_annotate_args(p: argparse.ArgumentParser) -> None:
    d, s, c = AnnotateConfig(), SamplingConfig(), CreditConfig()
    p.add_argument("--out", required=True, help="run directory (local path or pyarrow URI)")
    p.add_argument("--prompts", default=d.prompts, help="task JSONL file, folder of them, or 'demo'")
    p.add_argument("--tasks", default=",".join(d.tasks), help="comma list of sql,instructions,tools")
    p.add_argument("--split", choices=["train", "test"], default=None, help="only records of this split")
    p.add_argument("--limit", type=int, default=d.limit, help="prompts per task (0 = all)")
    p.add_argument("--credit", type=_kinds, default=c.kinds, help="comma list of gdpo,mrtpo,p2t")
    p.add_argument("--backend", choices=["transformers", "vllm"], default=d.backend)
    p.add_argument("--model", default=None, help="local policy folder (default: the shipped tiny policy)")
    p.add_argument("--reward-model", default=None, help="local reward-model folder for P2T")
    p.add_argument("--device", default=d.device)
    p.add_argument("--n", type=int, default=s.n, help="responses per prompt")
    p.add_argument("--max-new-tokens", type=int, default=s.max_new_tokens)
    p.add_argument("--temperature", type=float, default=s.temperature)
    p.add_argument("--top-p", type=float, default=s.top_p)
    p.add_argument("--seed", type=int, default=s.seed)
    p.add_argument("--beta", type=float, default=c.beta, help="MRTPO mixing coefficient")
    p.add_argument("--shard-size", type=int, default=d.shard_size, help="prompts per shard")
    p.add_argument("--run-id", default=None, help="name of the run (default: from the config hash)")


def annotate_config(args: argparse.Namespace) -> AnnotateConfig:
    return AnnotateConfig(
        prompts=args.prompts, tasks=tuple(args.tasks.split(",")), split=args.split,
        limit=args.limit or None, backend=args.backend, model=args.model, reward_model=args.reward_model,
        device=args.device, shard_size=args.shard_size,
        sampling=SamplingConfig(n=args.n, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                top_p=args.top_p, seed=args.seed),
        credit=CreditConfig(kinds=args.credit, beta=args.beta),
    )


def cmd_annotate(args: argparse.Namespace) -> int:
    from .annotate import run_annotation
    from .query import SUMMARY_SQL, run_query

    manifest = run_annotation(annotate_config(args), args.out, run_id=args.run_id)
    print(f"wrote {manifest['totals']} to {args.out} (checksum {manifest['dataset_checksum'][:16]})")
    print("stats:", json.dumps(manifest["stats"]))
    run_query(args.out, SUMMARY_SQL).show(max_rows=200, max_width=200)
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    from .query import run_query

    run_query(args.out, args.sql).show(max_rows=args.max_rows, max_width=200)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokencredit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("annotate", help="sample, verify and credit a prompt set; write Parquet")
    add_annotate_args(p)
    p.set_defaults(func=cmd_annotate)
    p = sub.add_parser("query", help="run SQL over a run directory's DuckDB views")
    p.add_argument("out")
    p.add_argument("sql")
    p.add_argument("--max-rows", type=int, default=100)
    p.set_defaults(func=cmd_query)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        print(f"tokencredit {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
