"""The peer: what a user writes instead of tokencredit. vLLM's `LLM.generate` over every prompt at once, then the
project's verifier functions called directly; no Prefect, no dataset writer, no credit.

    python bench/peer_script.py [--prompts FILE] [--split train] [--limit 64] [--n 4] [--max-new-tokens 96]
                                [--seed 0] [--model smollm2-135m-instruct] [--dtype float32] [--threads 2]
                                [--tokens FILE]

It samples what `tokencredit annotate --backend vllm` samples for the same options: the same records (the first
`--limit` of `--split`, in file order), each prompt's token ids as `render_prompt` renders them, response j of
record r drawn with seed `row_seed(seed, r, j)`, the sampled token's raw log-prob (`logprobs=0`), and the engine
built with `engine_options` (the KV cache, block size and thread binding annotate's engine gets), so that a
comparison measures the pipeline around the engine, not two engine settings. tests/test_peer_script.py holds it to
annotate's response token ids.

The last line of its output is one JSON object: the phase times in seconds (`imports`, `engine_start`,
`generate`, `verify`, and `total` from the process's first line), epoch `marks` of each phase's end, the
responses, their tokens, and the rewards' mean. `--tokens FILE` also writes {response_id: token ids}.
"""
from __future__ import annotations

import time

STARTED = time.time()  # before any import: the imports are the script's first phase

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "bench" / "closed_loop_prompts" / "prompts.jsonl"  # bench_engine.py's instruction prompts


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default=str(PROMPTS))
    parser.add_argument("--split", default="train", help="records of this split ('' for all)")
    parser.add_argument("--limit", type=int, default=64, help="the first LIMIT records of the split")
    parser.add_argument("--n", type=int, default=4, help="responses per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="registry name or folder ('' for the "
                        "shipped tiny policy, annotate's default)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=2, help="annotate's --cpu-threads")
    parser.add_argument("--tokens", default=None, help="write {response_id: token ids} to this JSON file")
    return parser.parse_args()


def main() -> dict:
    args = parse_args()
    marks = {}
    import vllm

    from tokencredit import verifiers
    from tokencredit.pipeline.models.loading import DEFAULT_POLICY, load_tokenizer, resolve_model_path
    from tokencredit.pipeline.sample.rows import render_prompt, row_seed
    from tokencredit.pipeline.sample.vllm_backend import engine_options

    marks["imports"] = time.time()
    folder = str(resolve_model_path(args.model or None, DEFAULT_POLICY))
    records = [r for r in verifiers.load_tasks(args.prompts)[0] if not args.split or r.split == args.split]
    records = records[:args.limit]
    tokenizer = load_tokenizer(folder)
    prompts = {r.id: render_prompt(tokenizer, r.prompt)[1] for r in records}
    llm = vllm.LLM(model=folder, tokenizer=folder, **engine_options("cpu", args.dtype, None, args.threads, True))
    marks["engine_start"] = time.time()

    rows = [(r, j) for r in records for j in range(args.n)]
    params = [vllm.SamplingParams(n=1, temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_new_tokens,
                                  logprobs=0, seed=row_seed(args.seed, r.id, j)) for r, j in rows]
    outputs = llm.generate([{"prompt_token_ids": prompts[r.id]} for r, _ in rows], params, use_tqdm=False)
    marks["generate"] = time.time()

    rewards = []
    for (record, _), output in zip(rows, outputs):
        scores = verifiers.verify(record, tokenizer.decode(output.outputs[0].token_ids, skip_special_tokens=True))
        rewards.append(statistics.fmean(s.score for s in scores) if scores else 0.0)
    marks["verify"] = time.time()

    tokens = {f"{r.id}/{j}": list(o.outputs[0].token_ids) for (r, j), o in zip(rows, outputs)}
    if args.tokens:
        Path(args.tokens).write_text(json.dumps(tokens))
    ends = [STARTED, *marks.values()]
    return {"phases": {name: end - begin for name, begin, end in zip(marks, ends, ends[1:])},
            "total": marks["verify"] - STARTED, "started": STARTED, "marks": marks, "responses": len(rows),
            "tokens": sum(map(len, tokens.values())), "mean_reward": statistics.fmean(rewards) if rewards else None,
            "model": args.model or "tokencredit/tiny", "dtype": args.dtype, "threads": args.threads}


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
