"""bench/RESULTS.md, rendered from the rows: `python -m bench --results-md` (tests/test_bench.py fails when the
committed file differs from its rendering).

One section per registered benchmark: what it measures, its targets, the latest row per machine and mode of
bench/results/runs.jsonl (the runner's rows), then its rows from before the runner (markdown_rows.jsonl: the log each
script assembled by hand, kept as written); then one per final study whose script was removed (REMOVED, beside the
rows: its name -> what it measured, its results files, the last commit that holds its script), rendered from its rows
alike; then the earlier sections no benchmark owns (older finished studies, the closed-loop experiments).
"""
from __future__ import annotations

import json
from pathlib import Path

from common import MARKDOWN_ROWS, RUNS
from registry import Benchmark, Target

TITLE = """# Benchmark results

Rendered by `python -m bench --results-md` from `bench/results/runs.jsonl` (a row per run of `python -m bench NAME`)
and `bench/results/markdown_rows.jsonl` (the rows written before the runner); do not edit by hand. A section per
benchmark: the latest row per machine and mode, each target met, MISSED or not measured.

Rows before the runner dated 2026-12-03 come from a 2-core machine shared with other jobs (up to 5 agents): every
ratio comes from runs interleaved in one process (medians), so that their load falls on both sides alike; absolute
seconds vary with it.
"""
OLD_COLUMNS = ("machine", "date", "mode", "sizes", "figures", "targets")
REMOVED = "removed.json"  # final studies whose scripts were removed, in the results folder


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def number(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def machine_of(row: dict) -> str:
    m = row["machine"]
    device = "" if m["device"] == "cpu" else f"{m['device']} + "
    return f"{device}{m['cores']}-core {m['cpu']}, {m['memory_gib']} GiB, {row['torch_threads']} torch thread(s)"


def latest(rows: list[dict]) -> list[dict]:
    """The last row of each (machine, mode), in the order of their first runs."""
    kept: dict[tuple, dict] = {}
    for row in rows:
        kept[(machine_of(row), row["mode"])] = row
    return list(kept.values())


def target_text(target: dict) -> str:
    met = {True: "met", False: "MISSED", None: "not measured"}[target["met"]]
    return f"{target['name']} {target['comparison']} {number(target['value'])}: {met}"


def runs_table(rows: list[dict]) -> list[str]:
    lines = ["| machine | date | mode | commit | load before, after | repeats | figures | targets |",
             "|---|---|---|---|---|---|---|---|"]
    for row in latest(rows):
        figures = "; ".join(f"{k} {number(v)}" for k, v in row["figures"].items()
                            if isinstance(v, (int, float, str, bool)) or v is None)
        load = f"{row['load_avg']['before'][0]:.1f}, {row['load_avg']['after'][0]:.1f}"
        lines.append("| " + " | ".join(cell(c) for c in (
            machine_of(row), row["date"][:10], row["mode"], row["commit"][:10], load, row["repeats"], figures,
            "; ".join(map(target_text, row["targets"])) or "none")) + " |")
    return lines


def old_sections(rows: list[dict]) -> list[str]:
    """The rows before the runner, grouped under their old headings, as they were written."""
    lines: list[str] = []
    for section in dict.fromkeys(r["section"] for r in rows):
        group = [r for r in rows if r["section"] == section]
        lines += [f"#### {section}", ""]
        if "text" in group[0]:
            lines += [group[0]["text"], ""]
            continue
        lines += [group[0]["intro"], "", "| " + " | ".join(OLD_COLUMNS) + " |", "|" + "---|" * len(OLD_COLUMNS)]
        lines += ["| " + " | ".join(cell(r[c]) for c in OLD_COLUMNS) + " |" for r in group] + [""]
    return lines


def section(bench: Benchmark, runs: list[dict], old: list[dict], last_commit: str | None = None) -> list[str]:
    """A registered benchmark's section; with `last_commit`, a final study's, whose script that commit last holds."""
    targets = ", ".join(f"`{t}`" for t in bench.targets) or "none (a study: its figures are read, not checked)"
    files = ", ".join(f"`bench/results/{f}`" for f in bench.results) or "its rows only"
    script = f"bench/{bench.module}.py"
    heading, run = ((f"{bench.name} (final study; script removed after commit {last_commit})",
                     f"Script: `git show {last_commit}:{script}`") if last_commit else
                    (bench.name, f"Run: `python -m bench {bench.name}`"))
    lines = [f"## {heading}", "", bench.measures, "", f"{run}. Targets: {targets}. Figures: {files}.", ""]
    lines += runs_table(runs) + [""] if runs else [f"No row from the runner{'' if last_commit else ' yet'}.", ""]
    if old:
        lines += ["### Rows before the runner", ""] + old_sections(old)
    return lines


def removed(results_dir: Path) -> dict[str, tuple[Benchmark, str]]:
    """name -> (the final study as a Benchmark without a run, the last commit holding its script), from REMOVED."""
    path = results_dir / REMOVED
    studies = json.loads(path.read_text()) if path.is_file() else {}
    return {name: (Benchmark(name, s["measures"], None, s["module"], tuple(s["results"]),
                             tuple(Target(*t) for t in s["targets"])), s["last_commit"])
            for name, s in studies.items()}


def render(benchmarks: dict[str, Benchmark], results_dir: Path) -> str:
    runs, old = read_rows(results_dir / RUNS), read_rows(results_dir / MARKDOWN_ROWS)
    final = {name: study for name, study in removed(results_dir).items() if name not in benchmarks}
    lines = [TITLE]
    for name, (bench, last_commit) in {**{n: (b, None) for n, b in benchmarks.items()}, **final}.items():
        lines += section(bench, [r for r in runs if r["benchmark"] == name], [r for r in old if r["benchmark"] == name],
                         last_commit)
    orphans = [r for r in old if r["benchmark"] not in benchmarks and r["benchmark"] not in final]
    if orphans:
        lines += ["## Earlier studies and experiments", "", "Sections of finished studies and of the closed-loop "
                  "experiments (`bench/closed_loop.py`, removed after 3cfae4c: their runs are `tokencredit compare` "
                  "designs now, bench/compare_designs/), which no registered benchmark runs.", ""]
        lines += old_sections(orphans)
    return "\n".join(lines).rstrip("\n") + "\n"


def write_results_md(benchmarks: dict[str, Benchmark], results_dir: Path, check: bool = False) -> int:
    """Render `results_dir`'s rows into the RESULTS.md beside it (bench/results -> bench/RESULTS.md); with `check`,
    only compare: 1 when the file is stale, else 0."""
    path, text = results_dir.parent / "RESULTS.md", render(benchmarks, results_dir)
    if check:
        stale = not path.is_file() or path.read_text() != text
        print(f"{path} is {'stale: run `python -m bench --results-md`' if stale else 'current'}")
        return int(stale)
    path.write_text(text)
    print(f"wrote {path}")
    return 0
