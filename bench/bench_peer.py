"""tokencredit against the script it replaces: `tokencredit annotate --backend vllm` and bench/peer_script.py (vLLM's
`generate` over every prompt at once, then the verifiers), interleaved, on SmolLM2-135M-Instruct in float32.

    python -m bench peer [--quick] [-- --repeats 3 --work DIR]

Arms, each a fresh process, run in turns (peer, gdpo, mrtpo, tree, peer, gdpo, ...) so that the shared machine's
load falls on all of them alike, `--repeats` times (>= 3 for a verdict):
- `peer`: bench/peer_script.py, the same prompts, seed, sampling options and engine options as annotate's;
- `gdpo`: `tokencredit annotate --backend vllm --credit gdpo` on the default runner (the Prefect flow on threads);
- `mrtpo`: the same with `--credit gdpo,mrtpo` (MRTPO's replay through the engine);
- `tree`: the same as `gdpo` with `--tree N/2,2` (N/2 roots per prompt continued twice: N leaves, as N flat).
Sizes: full, 64 prompts (bench_engine.py's instruction prompts, split train) x 4 responses of up to 96 new tokens;
`--quick`, 4 x 2 of 16 tokens, one repeat: a check of this script (tests/test_bench_peer.py), whose peer.json goes
to a temporary results folder. A run's wall is measured from its spawn to its exit; the 1-minute load average before
and after it. An annotate run's start-up, engine start, sampling span and per-stage seconds are read from its
manifest (`run_seconds`, `stats.seconds`: pipeline/timing.py), and so are the replay's counters
(`stats.replay_positions_computed`, `replay_positions_min`, `replay_response_positions`; the replay's seconds are
MRTPO's credit stage's, `stats.seconds.credit_mrtpo`), null where the manifest has none.

Keys (medians over the repeats) and the issue's targets (`targets`: [name, comparison, value, met]):
- `annotate_gdpo_over_peer`: gdpo's wall over the peer's, start included. <= 1.05
- `mrtpo_over_gdpo`: mrtpo's wall over gdpo's. <= 1.8
- `startup_over_peer`: gdpo's start-up (its process's start to the engine's first request) over the peer's imports
  plus engine start. <= 1.2
- `replay_tokens_over_min`: positions the replay computed over the distinct prefix positions it needed. <= 1.25
- `replay_flops_over_gemm_peak`: the replay's useful FLOPs (the decoder's over the distinct positions, the LM head's
  over the response positions, `replay_response_positions`) per second of MRTPO's credit stage (the replay and
  the little around it), over a float32 GEMM's FLOP/s measured in this run at the same thread count. >= 0.6
- `decode_flops_over_gemm_peak` (gdpo's) and `decode_flops_over_gemm_peak_peer`: the generated tokens times the
  decoder's and LM head's matmul FLOPs per token, over the seconds the engine sampled (the peer's `generate`;
  annotate's the shards' summed sampling seconds or the sampling span, the smaller: shards in turn leave the
  engine idle between them, shards at once each count the shared wait), over the GEMM's FLOP/s. gdpo's >= the
  peer's.
- `tree_over_flat`: the tree run's sampling seconds over gdpo's (start excluded). <= 0.85
and `repeats`, `load_avg` (min and max over every run's readings), `commit`, every run (`runs`), and where each
arm's time went (`where`: the medians of its phases and stages). A missed target's `notes` entry says where the
time went, from those medians.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import Harness, load_avg, ratio  # noqa: I001 - first: it puts the repository on the path
from bench_engine import MODEL, PROMPTS, commit_of_code
from registry import Target, Unavailable, benchmark

THREADS = 2  # --cpu-threads, the peer's --threads and the GEMM's: the machine's 2 cores
SIZES = {"full": {"prompts": 64, "n": 4, "max_new_tokens": 96, "repeats": 3},
         "quick": {"prompts": 4, "n": 2, "max_new_tokens": 16, "repeats": 1}}
ARMS = ("peer", "gdpo", "mrtpo", "tree")
TARGETS = {"annotate_gdpo_over_peer": ("<=", 1.05), "mrtpo_over_gdpo": ("<=", 1.8), "startup_over_peer": ("<=", 1.2),
           "replay_tokens_over_min": ("<=", 1.25), "replay_flops_over_gemm_peak": (">=", 0.6),
           "decode_flops_over_gemm_peak": (">=", "decode_flops_over_gemm_peak_peer"), "tree_over_flat": ("<=", 0.85)}
GEMM = """
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
n = 1024
a, b = torch.randn(n, n), torch.randn(n, n)
for _ in range(3):
    a @ b
best = 0.0
for _ in range(7):
    begin = time.perf_counter()
    for _ in range(5):
        a @ b
    best = max(best, 5 * 2 * n ** 3 / (time.perf_counter() - begin))
print(json.dumps(best))
"""


def env() -> dict:
    """The children's environment: the same threads for every arm (bench/common.py set 1 for this process)."""
    return {**os.environ, "OMP_NUM_THREADS": str(THREADS), "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false"}


def gemm_flops() -> float:
    """A float32 1024^3 GEMM's best FLOP/s on THREADS torch threads, in a process of its own."""
    done = subprocess.run([sys.executable, "-c", GEMM, str(THREADS)], capture_output=True, text=True, env=env(),
                          check=True)
    return json.loads(done.stdout)


def flops_per_token(model: str) -> tuple[float, float]:
    """(decoder, LM head) matmul FLOPs per token of `model`'s config (2 per weight; attention scores not counted)."""
    from tokencredit.pipeline.models.loading import DEFAULT_POLICY, resolve_model_path

    c = json.loads((resolve_model_path(model, DEFAULT_POLICY) / "config.json").read_text())
    h, heads = c["hidden_size"], c["num_attention_heads"]
    head_dim = c.get("head_dim") or h // heads
    kv = c.get("num_key_value_heads") or heads
    layer = 2 * h * heads * head_dim + 2 * h * kv * head_dim + 3 * h * c["intermediate_size"]
    return 2.0 * c["num_hidden_layers"] * layer, 2.0 * h * c["vocab_size"]


def timed(command: list[str], log: Path, timeout: float) -> tuple[float, list[float]]:
    """Run `command` (its output to `log`); (wall seconds, [load before, load after]). RuntimeError if it fails."""
    before, begin = load_avg(), time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env(), timeout=timeout).returncode
    wall = time.perf_counter() - begin
    if code != 0:
        raise RuntimeError(f"{' '.join(command[:4])} ... failed ({code}): {log.read_text()[-3000:]}")
    return wall, [before, load_avg()]


def run_peer(s: dict, args, log: Path) -> dict:
    command = [sys.executable, str(Path(__file__).with_name("peer_script.py")), "--prompts", str(PROMPTS),
               "--split", "train", "--limit", str(s["prompts"]), "--n", str(s["n"]),
               "--max-new-tokens", str(s["max_new_tokens"]), "--model", args.model, "--dtype", "float32", "--threads", str(THREADS)]
    wall, loads = timed(command, log, args.timeout)
    report = json.loads(log.read_text().strip().splitlines()[-1])
    return {"wall_s": round(wall, 2), "load_avg": loads, "phases": report["phases"], "total_s": report["total"],
            "tokens": report["tokens"], "responses": report["responses"]}


def run_annotate(arm: str, s: dict, args, log: Path) -> dict:
    """One `tokencredit annotate` of the arm into a fresh folder; its wall and what its manifest says."""
    from tokencredit.pipeline.dataset.query import connect

    out = args.work / arm
    shutil.rmtree(out, ignore_errors=True)
    shape = ["--tree", f"{s['n'] // 2},2"] if arm == "tree" else ["--n", str(s["n"])]
    command = [sys.executable, "-m", "tokencredit.flows.cli", "annotate", "--out", str(out), "--prompts", str(PROMPTS),
               "--split", "train", "--limit", str(s["prompts"]), *shape, "--max-new-tokens", str(s["max_new_tokens"]),
               "--credit", "gdpo,mrtpo" if arm == "mrtpo" else "gdpo", "--backend", "vllm", "--model", args.model,
               "--dtype", "float32", "--cpu-threads", str(THREADS)]
    wall, loads = timed(command, log, args.timeout)
    manifest = json.loads((out / "manifest.json").read_text())
    stats, run = manifest["stats"], manifest.get("run_seconds") or {}
    tokens = connect(str(out)).execute("SELECT sum(len(token_ids)) FROM responses").fetchone()[0]
    busy = [v for v in (stats.get("seconds", {}).get("sample"), run.get("sampling")) if v is not None]
    return {"wall_s": round(wall, 2), "load_avg": loads, "run_seconds": run, "seconds": stats.get("seconds", {}),
            "sampling_s": min(busy) if busy else None, "tokens": tokens, "responses": manifest["totals"]["responses"],
            "after_manifest_s": round(wall - run["total"], 2) if run.get("total") else None,
            "replay_s": stats.get("seconds", {}).get("credit_mrtpo"),
            **{key: stats.get(key) for key in ("replay_positions_computed", "replay_positions_min",
                                               "replay_response_positions", "tokens_replayed", "replays_done")}}


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def where(runs: dict) -> dict:
    """Each arm's medians: its wall, and the peer's phases or an annotate arm's wall times and stage seconds."""
    wall = ("startup", "engine_start", "sampling")
    out = {}
    for arm, rows in runs.items():
        parts = [{"wall_s": r["wall_s"], **r["phases"]} if arm == "peer" else
                 {"wall_s": r["wall_s"], **{k: r["run_seconds"].get(k) for k in wall}, **r["seconds"]} for r in rows]
        medians = {name: median(part.get(name) for part in parts) for name in dict.fromkeys(n for p in parts for n in p)}
        out[arm] = {name: None if v is None else round(v, 2) for name, v in medians.items()}
    return out


def summarize(runs: dict, gemm: list[float], args, mode: str) -> dict:
    """The issue's keys from the runs (medians), each target's verdict, and a note on each missed one."""
    decoder, head = flops_per_token(args.model)
    peak = max(gemm)
    peer, gdpo, mrtpo, tree = (runs[arm] for arm in ARMS)
    peer_wall, gdpo_wall = median(r["wall_s"] for r in peer), median(r["wall_s"] for r in gdpo)
    peer_start = median(r["phases"]["imports"] + r["phases"]["engine_start"] for r in peer)

    def replay(key: str, r: dict) -> float | None:
        if key == "tokens":
            return ratio(r["replay_positions_computed"], r["replay_positions_min"])
        positions = r["replay_response_positions"]
        if None in (r["replay_positions_min"], r["replay_s"], positions) or not r["replay_s"]:
            return None
        return (r["replay_positions_min"] * decoder + positions * head) / r["replay_s"] / peak

    def decode(r: dict, seconds: float | None) -> float | None:
        return None if not seconds else r["tokens"] * (decoder + head) / seconds / peak
    keys = {"annotate_gdpo_over_peer": ratio(gdpo_wall, peer_wall),
            "mrtpo_over_gdpo": ratio(median(r["wall_s"] for r in mrtpo), gdpo_wall),
            "startup_over_peer": ratio(median(r["run_seconds"].get("startup") for r in gdpo), peer_start),
            "replay_tokens_over_min": median(replay("tokens", r) for r in mrtpo),
            "replay_flops_over_gemm_peak": median(replay("flops", r) for r in mrtpo),
            "decode_flops_over_gemm_peak": median(decode(r, r["sampling_s"]) for r in gdpo),
            "decode_flops_over_gemm_peak_peer": median(decode(r, r["phases"]["generate"]) for r in peer),
            "tree_over_flat": ratio(median(r["sampling_s"] for r in tree), median(r["sampling_s"] for r in gdpo))}
    keys = {k: round(v, 3) if v is not None else None for k, v in keys.items()}
    targets = []
    for name, (op, bound) in TARGETS.items():
        bound_value = keys[bound] if isinstance(bound, str) else bound
        value = keys[name]
        met = None if value is None or bound_value is None else (
            value <= bound_value if op == "<=" else value >= bound_value)
        targets.append([name, f"{op} {bound}", value, met])
    times = where(runs)
    readings = [x for rows in runs.values() for r in rows for x in r["load_avg"]]
    return {**keys, "targets": targets, "notes": notes(targets, times), "where": times,
            "gemm_gflops": [round(g / 1e9, 1) for g in gemm], "flops_per_token": {"decoder": decoder, "lm_head": head},
            "repeats": len(peer), "load_avg": {"min": min(readings), "max": max(readings)},
            **commit_of_code(("bench/bench_peer.py", "bench/peer_script.py")), "mode": mode,
            "sizes": {k: v for k, v in SIZES[mode].items() if k != "repeats"}, "model": args.model,
            "dtype": "float32", "threads": THREADS, "runs": runs}


def notes(targets: list, times: dict) -> dict:
    """For each missed target, where the time went (the medians of `where`), in one line."""
    peer, gdpo, mrtpo = times["peer"], times["gdpo"], times["mrtpo"]
    said = {
        "annotate_gdpo_over_peer": f"gdpo {gdpo['wall_s']} s (start-up {gdpo['startup']} s, engine start "
                                   f"{gdpo['engine_start']} s, sampling span {gdpo['sampling']} s, shards' sample "
                                   f"{gdpo.get('sample')} s, verify {gdpo.get('verify')} s, write {gdpo.get('write')} "
                                   f"s) against the peer's {peer['wall_s']} s (imports {peer['imports']} s, engine "
                                   f"start {peer['engine_start']} s, generate {peer['generate']} s, verify "
                                   f"{peer['verify']} s)",
        "mrtpo_over_gdpo": f"mrtpo {mrtpo['wall_s']} s, of which credit_mrtpo {mrtpo.get('credit_mrtpo')} s (shards "
                           f"summed), against gdpo's {gdpo['wall_s']} s",
        "startup_over_peer": f"gdpo's start-up {gdpo['startup']} s (engine start {gdpo['engine_start']} s) against "
                             f"the peer's imports {peer['imports']} s + engine start {peer['engine_start']} s",
        "tree_over_flat": f"tree sampling {times['tree']['sampling']} s against flat {gdpo['sampling']} s (spans)",
    }
    return {name: said.get(name, "see `where`") for name, _, _, met in targets if met is False}


@benchmark("peer", measures="`tokencredit annotate --backend vllm` against `peer_script.py`, the plain vLLM + "
           "verifiers script it replaces, interleaved, SmolLM2-135M float32: start-up, stage seconds and replay "
           "counters read from the runs' manifests.", results=("peer.json",), needs=("vllm",),
           targets=tuple(Target(name, op, bound) for name, (op, bound) in TARGETS.items()))
def run(h: Harness) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench peer --")
    parser.add_argument("--repeats", type=int, default=None, help="turns of every arm (default: 3; --quick 1)")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench_peer"), help="the runs' folders and logs")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    args = parser.parse_args(h.argv)
    args.quick, args.results = h.quick, h.results("peer.json")
    from tokencredit.pipeline.models.registry import is_pulled

    if args.model == MODEL and not is_pulled(MODEL):
        raise Unavailable(f"run `tokencredit models pull {MODEL}` first")
    mode = h.mode
    s = SIZES[mode]
    repeats = h.repeats = args.repeats or s["repeats"]
    args.work.mkdir(parents=True, exist_ok=True)
    gemm, runs = [gemm_flops()], {arm: [] for arm in ARMS}
    for i in range(repeats):
        for arm in ARMS:
            print(f"[{time.strftime('%H:%M:%S')}] {arm} {i + 1}/{repeats} (load {load_avg()})", file=sys.stderr,
                  flush=True)
            log = args.work / f"{arm}-{i}.log"
            runs[arm].append(run_peer(s, args, log) if arm == "peer" else run_annotate(arm, s, args, log))
        if i + 1 < repeats:  # what the turns so far give, in case the run is cut short
            partial = {**summarize(runs, gemm, args, mode), "partial": f"{i + 1} of {repeats} turns"}
            args.results.write_text(json.dumps(partial, indent=1) + "\n")
    gemm.append(gemm_flops())
    result = summarize(runs, gemm, args, mode)
    args.results.write_text(json.dumps(result, indent=1) + "\n")
    return result
