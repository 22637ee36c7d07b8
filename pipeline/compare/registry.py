"""Pre-registration of a compare folder: the design's hash and git commit, recorded before anything is scored.

DIR/registration.json holds the design file's sha256, its commit (the last commit of the file, when the file is
tracked and unmodified in a git repository; else null: not pre-registered), that commit's time, the design's
content, and the sha256 of every input the design names (prompt file, databases, models, plugin sources). A later
run into DIR under another design is refused, unless the only change is added arms: those are recorded as an
amendment and are exploratory in every table; a later run whose inputs changed is refused too. A policy scored
before the design's commit time is named as such (`scored_before_commit`).
"""
from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from tokencredit.pipeline.compare.design import Design, without_arms
from tokencredit.pipeline.dataset.writer import _changed_input
from tokencredit.pipeline.interrupts import hold

REGISTRATION = "registration.json"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def temporary(path: Path, suffix: str = ".tmp") -> Path:
    """PATH + suffix, where an atomic write of PATH goes first, whatever was left under that name removed: a
    symbolic link there is replaced, never written through to where it points."""
    tmp = path.with_name(path.name + suffix)
    tmp.unlink(missing_ok=True)
    return tmp


def write_json(path: Path, value) -> None:
    """Atomic: a temporary file renamed over `path`, so a kill leaves the old file or the new one, and an interrupt
    (SIGINT/SIGTERM, tokencredit.pipeline.interrupts) none of what it cut short."""
    tmp = temporary(path)
    tmp.write_text(json.dumps(value, indent=1))
    hold()  # an interrupt being handled: nothing computed during it is committed
    os.replace(tmp, path)


def save_figure(fig, path: Path) -> None:
    """A matplotlib figure as a PNG at `path`, closed, atomically as `write_json` writes."""
    import matplotlib.pyplot as plt

    tmp = temporary(path, ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    hold()
    tmp.replace(path)


def git_commit(path: str | Path) -> tuple[str | None, str | None]:
    """(commit, its UTC time) of the last commit touching `path`, when it is tracked and unmodified in a git
    repository; (None, None) otherwise (not in a repository, untracked, or changed since its last commit)."""
    path = Path(path).resolve()

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(path.parent), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    if git("status", "--porcelain", "--", path.name) != "":  # None: no repository; text: untracked or modified
        return None, None
    found = git("log", "-1", "--format=%H %cI", "--", path.name)
    if not found:
        return None, None
    commit, when = found.split()
    return commit, datetime.fromisoformat(when).astimezone(timezone.utc).isoformat(timespec="seconds")


def canonical(content: dict) -> str:
    return json.dumps(content, sort_keys=True, default=list)


def register(design: Design, out: Path, inputs: dict[str, dict]) -> dict:
    """DIR's registration, written on the first run with the design's `inputs` (run.design_inputs: each input's
    sha256); a run under a changed design is refused (ValueError, one line) unless it only adds arms, which are
    recorded as exploratory, and so is a run whose inputs changed (a registration from before inputs were recorded
    has none to compare)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / REGISTRATION
    if not path.is_file():
        commit, when = git_commit(design.path)
        registration = {"design_path": design.path, "design_hash": design.sha256, "design_commit": commit,
                        "design_commit_time": when, "registered_at": now(), "arms": list(design.arms),
                        "content": json.loads(canonical(without_arms(design, set()))), "amendments": [],
                        "inputs": inputs}
        write_json(path, registration)
        return registration
    registration = json.loads(path.read_text())
    changed = _changed_input(registration["inputs"], inputs) if "inputs" in registration else None
    if changed:
        raise ValueError(f"{out} was registered with other inputs: {changed} since; restore it, or score the "
                         f"design into a new --out")
    known = {registration["design_hash"], *(a["design_hash"] for a in registration["amendments"])}
    if design.sha256 in known:
        return registration
    added = set(design.arms) - set(registration["arms"]) - {a for x in registration["amendments"] for a in x["arms"]}
    if (set(registration["arms"]) - set(design.arms)
            or canonical(without_arms(design, added | exploratory_arms(registration))) != canonical(
                registration["content"])):
        raise ValueError(f"{out} was registered under design sha256 {registration['design_hash'][:12]} "
                         f"({registration['design_path']}); {design.path} now hashes {design.sha256[:12]} and changes "
                         f"more than adding arms: score it into a new --out")
    commit, when = git_commit(design.path)
    registration["amendments"].append({"design_hash": design.sha256, "design_commit": commit, "at": now(),
                                       "arms": sorted(added)})
    write_json(path, registration)
    return registration


def exploratory_arms(registration: dict) -> set[str]:
    """Arms added after the registration (amendments): exploratory in every table."""
    return {arm for amendment in registration["amendments"] for arm in amendment["arms"]}


def scored_before_commit(registration: dict, scored_at: str | None) -> bool:
    """Whether a policy scored at `scored_at` (UTC ISO) was scored before the design's commit (or the design
    was never committed: nothing it scored was pre-registered)."""
    when = registration.get("design_commit_time")
    return when is None or scored_at is None or scored_at < when
