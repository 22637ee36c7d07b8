"""Replay and P2T throughput of a ~1.5B-parameter Qwen2-style model on one CUDA GPU, and the product's paths there.

    python -m bench gpu [--quick] [-- --peak-tflops 790]     # on a CUDA machine; figures to $OUT too if set
    python -m bench gpu --quick                               # no CUDA device: the torch part on CPU, tiny config

The model is built from a Qwen2-1.5B-shaped config with random weights in bf16 (nothing is
downloaded). Inputs are random token ids: N responses of T tokens after a P-token task prompt and
K feedback sections. Reported per benchmark: seconds, tokens per second (every token through the
model: prompt + response of every sequence forwarded), and the fraction of the FLOP ceiling
2 x parameters x tokens / peak (790 TFLOP/s by default). P2T's backward roughly doubles its FLOPs, so
its fraction of the forward ceiling can reach ~1/3 at most.

The product's own paths on the device (where vllm imports, unless `--no-engine`; never on CPU, where the `engine`
benchmark measures them): the same shape saved as a model folder with the shipped tiny policy's tokenizer
(vocabulary 2,210, so the LM head is small and the body dominates), measured by the `engine` benchmark's code on
`--device cuda` (bench_engine.py: flat sampling on both backends per dtype, engine start apart; 4x4 tree against 16
flat samples on the engine; MRTPO's replay through the engine against the torch replay; `tokencredit annotate` on
each backend as a fresh command), each in a child process, at its `full` sizes (--quick: `reduced`). Figures go to
the results folder's gpu_bench.json (the engine's summary under `engine`) and gpu_engine.json (its measurements: a
rerun resumes them), and to $OUT. Nothing is downloaded or installed: run it where `pip install -e ".[gpu]"` was
done beforehand.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("BENCH_THREADS", str(os.cpu_count()))  # common.py pins 1 thread for the shared CPU box
import torch  # noqa: E402

from common import Harness, median_time, padded_forward  # noqa: E402 - after BENCH_THREADS
from registry import Unavailable, benchmark  # noqa: E402

QWEN2_1_5B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                  rope_theta=1e6, tie_word_embeddings=True)
SMOKE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True)
PAD = 0


def build(shape: dict, device: str, dtype: torch.dtype, reward_model: bool = False):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

    config = Qwen2Config(**shape, pad_token_id=PAD, eos_token_id=1, bos_token_id=None, num_labels=1)
    torch.manual_seed(0)
    with torch.device(device):
        model = (Qwen2ForSequenceClassification if reward_model else Qwen2ForCausalLM)(config)
    return model.to(dtype).eval()


def timed(fn, device: str, repeats: int) -> float:
    """Median seconds of fn() after one warm-up call, each call's time holding the GPU work it queued."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    return median_time(lambda: (fn(), sync()), repeats)[0]


def random_items(n: int, prompt: int, section: int, k: int, response: int, vocab: int, seed: int = 0):
    """ReplayItems with every pair ungated: P_all = task + K sections + marker, P_\\k drops section k."""
    from tokencredit.pipeline.credit.replay import ReplayItem

    rng = random.Random(seed)
    ids = lambda m: [rng.randrange(2, vocab) for _ in range(m)]  # noqa: E731 - 0, 1 are pad and eos
    items = []
    for _ in range(n):
        task, sections, marker = ids(prompt), [ids(section) for _ in range(k)], ids(4)
        joined = lambda drop: task + [t for j, s in enumerate(sections) if j != drop for t in s] + marker  # noqa: E731
        items.append(ReplayItem(joined(None), [joined(j) for j in range(k)], ids(response)))
    return items


def figure(seconds: float, tokens: int, params: int, peak: float) -> dict:
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
            "ceiling_fraction": 2 * params * tokens / seconds / peak}


def bench_replay(model, items, device, repeats, params, peak, batch_size=16) -> dict:
    from tokencredit.pipeline.credit.replay import replay_distances

    seqs = [p + it.response_ids for it in items for p in [it.all_prompt_ids, *it.drop_prompt_ids]]
    seconds = timed(lambda: replay_distances(model, items, batch_size=batch_size, chunk_size=128), device, repeats)
    plain = timed(lambda: padded_forward(model, seqs, batch_size), device, repeats)  # P_all and P_\k: 2 lengths
    tokens = sum(map(len, seqs))
    return {**figure(seconds, tokens, params, peak), "plain_forward_seconds": plain, "over_plain": seconds / plain,
            "replayed_tokens": sum(len(it.response_ids) * len(it.drop_prompt_ids) for it in items)}


def bench_p2t(rm, items, device, repeats, params, peak, batch_size=8) -> dict:
    from tokencredit.pipeline.credit.p2t import attribute

    prompts, responses = [it.all_prompt_ids for it in items], [it.response_ids for it in items]
    seconds = timed(lambda: attribute(rm, prompts, responses, batch_size=batch_size), device, repeats)
    plain = timed(lambda: padded_forward(rm, [p + r for p, r in zip(prompts, responses)], batch_size), device, repeats)
    tokens = sum(len(p) + len(r) for p, r in zip(prompts, responses))
    return {**figure(seconds, tokens, params, peak), "plain_forward_seconds": plain, "over_plain": seconds / plain}


TINY_TOKENIZER = Path(__file__).resolve().parent.parent / "pipeline" / "models" / "tiny-policy"


def engine_folder(shape: dict, dtype: torch.dtype) -> Path:
    """`shape` with random weights (seed 0) and the tiny policy's vocabulary, saved with its tokenizer files: a
    model folder both backends load by path."""
    folder = Path(tempfile.mkdtemp(prefix="gpu_bench_engine_"))
    tokenizer_config = json.loads((TINY_TOKENIZER / "config.json").read_text())
    model = build({**shape, "vocab_size": tokenizer_config["vocab_size"]}, "cpu", dtype)
    model.config.eos_token_id = tokenizer_config.get("eos_token_id", 1)
    model.save_pretrained(folder, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(TINY_TOKENIZER / name, folder / name)
    return folder


def engine_paths(folder: Path, quick: bool, path: Path) -> dict:
    """The engine benchmark's measurements (bench_engine.py) of the model in `folder` on the CUDA device, its results
    file at `path` (a rerun resumes it); its summary keys."""
    from bench_engine import measure_all, options

    args = options().parse_args(["--mode", "reduced" if quick else "full", "--only", "sample,replay,tree,annotate",
                                 "--model", str(folder), "--device", "cuda"])
    return measure_all(args, path)


@benchmark("gpu", measures="Replay and P2T throughput of a random-weight bf16 Qwen2-1.5B-shaped model on one CUDA "
           "GPU (tokens/s over every forwarded token, the fraction of the FLOP ceiling 2 x params x tokens / peak), "
           "and "
           "the product's paths on the device: both samplers (vLLM's sampling), tree sampling, the engine replay, "
           "annotate on each backend. Without a CUDA device, --quick checks the torch part on CPU with a tiny config.",
           results=("gpu_bench.json",))
def run(h: Harness) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench gpu --")
    parser.add_argument("--peak-tflops", type=float, default=790.0, help="bf16 dense peak of the GPU")
    parser.add_argument("--no-engine", action="store_true",
                        help="skip the product's paths on the engine (sampling, tree, engine replay, annotate)")
    args = parser.parse_args(h.argv)
    smoke = not torch.cuda.is_available()
    if smoke and not h.quick:
        raise Unavailable("no CUDA device here (torch.cuda.is_available() is False); --quick checks the script on CPU")

    device, dtype, shape = ("cpu", torch.float32, SMOKE) if smoke else ("cuda", torch.bfloat16, QWEN2_1_5B)
    n, prompt, section, k, response = (8, 32, 8, 3, 32) if smoke else (
        (32, 256, 32, 3, 512) if h.quick else (64, 256, 32, 3, 512))
    h.repeats = 1 if smoke else (2 if h.quick else 3)
    peak = args.peak_tflops * 1e12
    policy = build(shape, device, dtype)
    params = sum(p.numel() for p in policy.parameters())
    items = random_items(n, prompt, section, k, response, shape["vocab_size"])
    results: dict = {"params": params, "sizes": {"responses": n, "response_tokens": response, "prompt_tokens": prompt,
                                                 "feedback_sections": k, "section_tokens": section},
                     "peak_tflops": args.peak_tflops}
    results["replay"] = bench_replay(policy, items, device, h.repeats, params, peak)
    rm = build(shape, device, dtype, reward_model=True)
    results["p2t"] = bench_p2t(rm, items, device, h.repeats, params, peak)
    del rm
    results["machine"] = torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)"
    if smoke or args.no_engine or importlib.util.find_spec("vllm") is None:
        results["engine"] = "not measured: " + ("no CUDA device" if smoke else "--no-engine or vllm not importable")
    else:
        del policy
        folder = engine_folder(shape, dtype)
        try:
            results["engine"] = engine_paths(folder, h.quick, h.results("gpu_engine.json"))
        except Exception as error:  # noqa: BLE001 - keep the figures measured before
            results.setdefault("engine", f"failed: {type(error).__name__}: {error}")
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    h.results("gpu_bench.json").write_text(json.dumps(results, indent=2))
    for name in ("gpu_bench.json", "gpu_engine.json") if os.environ.get("OUT") else ():
        if h.results(name).is_file():
            shutil.copy(h.results(name), os.environ["OUT"])
    r, p = results["replay"], results["p2t"]
    return {"params": params, "replay_tokens_per_s": r["tokens_per_s"], "replay_ceiling_fraction": r["ceiling_fraction"],
            "replay_over_plain": r["over_plain"], "p2t_tokens_per_s": p["tokens_per_s"],
            "p2t_ceiling_fraction": p["ceiling_fraction"], "p2t_over_plain": p["over_plain"],
            "machine": results["machine"]}
