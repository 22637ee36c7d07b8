"""The rounds pilot (issue 50, item 4): in which regime does training in rounds move SmolLM2-135M's reward, and at
what cost? Train and dev prompts only: the dev prompts are the last 64 records of the train split of
`closed_loop_prompts/prompts.jsonl` (relabelled `test` in the pilot's own prompt file, so that `rounds --dev-split
test` scores them), never trained on; no held-out record is read.

    python bench/pilot_rounds.py [--work DIR] [--arms lr3e-4,lr1e-3] [--summarize-only]

Each arm is one `tokencredit rounds` (GDPO credit and advantage, LoRA, 64 train prompts x 8 responses at temperature
0.5 of up to 96 tokens, 16 steps of batch 8, 3 rounds, the vLLM CPU engine in float32, no Prefect) at its learning
rate; a rerun resumes each arm where it stopped. Writes bench/results/compare_pilot.json: per arm its regime, the
dev reward of the start policy and of each round's policy (greedy), each round's gain over the start with a 95%
interval over the dev prompts (paired by prompt; one training seed per arm, so the seed's variance is not in it),
and the cost of each round's stages in seconds (annotate, train, dev scoring).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "bench" / "closed_loop_prompts" / "prompts.jsonl"
RESULTS = ROOT / "bench" / "results" / "compare_pilot.json"
DEV_PROMPTS = 64  # the train split's last records: the dev prompts
TARGET_GAIN = 0.15  # issue 50: GDPO's dev gain over the start policy, three times the one-round offline design's
REGIME = ["--split", "train", "--limit", "64", "--dev-split", "test", "--dev-limit", str(DEV_PROMPTS),
          "--rounds", "3", "--model", "smollm2-135m-instruct", "--backend", "vllm", "--dtype", "float32",
          "--cpu-threads", "2", "--n", "8", "--temperature", "0.5", "--max-new-tokens", "96", "--seed", "2026",
          "--credit", "gdpo", "--advantage", "gdpo", "--steps", "16", "--batch-size", "8", "--lora",
          "--train-seed", "300", "--runner", "none"]
ARMS = {"lr3e-4": ["--lr", "3e-4"], "lr1e-3": ["--lr", "1e-3"]}


def pilot_prompts(work: Path) -> Path:
    """The train split of PROMPTS, its last DEV_PROMPTS records relabelled `test` (the dev prompts)."""
    train = [r for r in map(json.loads, PROMPTS.read_text().splitlines()) if r["split"] == "train"]
    for record in train[-DEV_PROMPTS:]:
        record["split"] = "test"
    path = work / "pilot_prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in train))
    return path


def run_arm(name: str, work: Path, prompts: Path) -> None:
    command = ["tokencredit", "rounds", "--out", str(work / name), "--prompts", str(prompts), *REGIME, *ARMS[name]]
    env = {**os.environ, "OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE", "DO_NOT_TRACK": "1"}
    with open(work / f"{name}.log", "a") as log:
        subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, check=True)


def paired_gain(after: dict[str, float], start: dict[str, float]) -> dict:
    """Mean of after - start over the prompts both scored, with its 95% t interval (the prompts' variance only)."""
    from scipy import stats

    diffs = [after[i] - start[i] for i in start if i in after]
    mean, se = statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs))
    half = stats.t.ppf(0.975, len(diffs) - 1) * se
    return {"gain": round(mean, 4), "ci95": [round(mean - half, 4), round(mean + half, 4)], "prompts": len(diffs)}


def summarize_arm(name: str, folder: Path) -> dict:
    """An arm's regime, dev rewards, gains and costs, from the files `rounds` wrote."""
    settings = json.loads((folder / "rounds.json").read_text())
    start = json.loads((folder / "start" / "dev.json").read_text())
    rounds = []
    for r in sorted(folder.glob("round-*/dev.json")):
        dev = json.loads(r.read_text())
        manifest = json.loads((r.parent / "run" / "manifest.json").read_text())
        train = json.loads((r.parent / "checkpoint" / "seconds.json").read_text())
        rounds.append({"round": dev["round"], "dev_reward": round(dev["reward"], 4),
                       **paired_gain(dev["rewards"], start["rewards"]),
                       "seconds": {"annotate": manifest["run_seconds"]["total"], "train": train["seconds"],
                                   "dev_scoring": dev["seconds"]}})
    sampling, train = settings["annotate"]["sampling"], settings["train"]
    best = max(rounds, key=lambda r: r["gain"]) if rounds else None
    return {"arm": name, "regime": {"train_prompts": settings["annotate"]["limit"], "n": sampling["n"],
                                    "temperature": sampling["temperature"], "max_new_tokens": sampling["max_new_tokens"],
                                    "steps": train["steps"], "batch_size": train["batch_size"], "lr": train["lr"],
                                    "lora": train["lora"], "rounds_done": len(rounds), "credit": "gdpo",
                                    "advantage": train["advantage"]},
            "dev_prompts": start["prompts"], "start_dev_reward": round(start["reward"], 4), "rounds": rounds,
            "best_gain": best and best["gain"], "best_round": best and best["round"],
            "target_gain": TARGET_GAIN, "met": bool(best and best["gain"] >= TARGET_GAIN),
            "seconds_total": round(start["seconds"] + sum(sum(r["seconds"].values()) for r in rounds), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/pilot_rounds"), help="the arms' rounds folders")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma list of {', '.join(ARMS)}")
    parser.add_argument("--summarize-only", action="store_true", help="write the results from the folders as they are")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    arms = [a for a in args.arms.split(",") if a]
    if not args.summarize_only:
        prompts = pilot_prompts(args.work)
        for name in arms:
            run_arm(name, args.work, prompts)
    rows = [summarize_arm(name, args.work / name) for name in arms if (args.work / name / "start" / "dev.json").is_file()]
    RESULTS.write_text(json.dumps({"design": __doc__.split("\n\n")[0].replace("\n", " "), "arms": rows,
                                   "machine": f"{os.cpu_count()}-core CPU"}, indent=1) + "\n")
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
