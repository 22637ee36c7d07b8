"""What `tokencredit serve` ran under its `--out`: one record per scheduled run, read by `tokencredit runs`.

    OUT/<folder>/schedule.json    a scheduled run: Prefect's flow run, start, end, state, error line (a rounds
                                  job's, `serve --rounds`: its number of rounds too; its folder holds rounds.json)
    OUT/_skipped/<folder>.json    a run skipped because the previous one was still writing

A run writes its record as it starts (state `running`, with its host and process id) and again as
it ends: `complete`, `failed` (with the error's one line) or `stopped` (serve was stopped, or the
run was cancelled). A run killed outright leaves `running` behind a process that is gone: it reads
as `incomplete`, as does a stopped one; its dataset's manifest says `complete: false` either way,
and `tokencredit runs OUT --resume FOLDER` finishes it (the shards written are kept).
"""
from __future__ import annotations

import datetime
import json
import os
import socket
import uuid
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from tokencredit.pipeline.dataset.writer import filesystem, read_manifest, stage_seconds
from tokencredit.pipeline.names import inside
from tokencredit.pipeline.progress import Phase
from tokencredit.pipeline.rounds import SETTINGS, RoundsConfig, summary
from tokencredit.pipeline.timing import describe

RECORD = "schedule.json"
SKIPPED = "_skipped"


def now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def write_json(out: str, relpath: str, obj: dict[str, Any]) -> None:
    """OUT/relpath written atomically (a temporary name, then a rename), its folder created."""
    fs, root = filesystem(out)
    path = f"{root}/{relpath}"
    folder, name = path.rsplit("/", 1)
    fs.create_dir(folder, recursive=True)
    tmp = f"{folder}/.{name}.{uuid.uuid4().hex}.tmp"
    with fs.open_output_stream(tmp) as stream:
        stream.write(json.dumps(obj, indent=2, sort_keys=True).encode())
    fs.move(tmp, path)


def read_json(fs: pafs.FileSystem, path: str) -> dict[str, Any] | None:
    try:
        with fs.open_input_stream(path) as stream:
            return json.loads(stream.read())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def start_record(out: str, folder: str, flow_run: dict[str, Any]) -> dict[str, Any]:
    """Record a scheduled run as it starts; returns the record to pass to `end_record`."""
    record = {"folder": folder, "state": "running", "start": now(), "end": None, "error": None,
              "host": socket.gethostname(), "pid": os.getpid(), **flow_run}
    write_json(out, f"{folder}/{RECORD}", record)
    return record


def end_record(out: str, record: dict[str, Any], state: str, error: str | None = None) -> None:
    write_json(out, f"{record['folder']}/{RECORD}", {**record, "state": state, "end": now(), "error": error})


def skip_record(out: str, folder: str, reason: str, flow_run: dict[str, Any]) -> None:
    stamp = now()
    write_json(out, f"{SKIPPED}/{folder}.json", {"folder": folder, "state": "skipped", "start": stamp, "end": stamp,
                                                 "error": reason, **flow_run})


def _alive(record: dict[str, Any]) -> bool:
    """The run's process still exists (on this host; on another one it is taken to be alive)."""
    if record.get("host") != socket.gethostname():
        return True
    try:
        pid = int(record["pid"])
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, KeyError, TypeError, ValueError):
        return True
    try:  # a killed process not yet reaped (a zombie) is gone too
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _responses(fs: pafs.FileSystem, root: str, manifest: dict[str, Any] | None) -> int:
    """Responses written: the manifest's total when complete, else the sum over the shards' markers."""
    if manifest and manifest.get("complete"):
        return int(manifest.get("totals", {}).get("responses", 0))
    infos = fs.get_file_info(pafs.FileSelector(f"{root}/_shards", allow_not_found=True))
    markers = [read_json(fs, i.path) for i in infos if i.base_name.startswith("shard-") and i.base_name.endswith(".json")]
    return sum(int(m.get("responses", {}).get("rows", 0)) for m in markers if m)


def list_runs(out: str) -> list[dict[str, Any]]:
    """The runs under `out`, oldest first: folder, start, end, state, responses, error (one line), the run's wall
    seconds and each stage's seconds (`writer.stage_seconds`), for a rounds job (`serve --rounds`) `dev`, each
    scored policy's dev reward (`rounds.summary`), and for an incomplete one `resume`, the command that finishes it.
    A folder with a dataset but no schedule record (an `annotate` into OUT) is listed by its manifest."""
    fs, root = filesystem(out)
    if fs.get_file_info(root).type != pafs.FileType.Directory:
        raise FileNotFoundError(f"{out}: no such folder (the --out of tokencredit serve)")
    rows = []
    for info in fs.get_file_info(pafs.FileSelector(root)):
        if info.type != pafs.FileType.Directory or info.base_name.startswith((".", "_")):
            continue
        path = f"{out.rstrip('/')}/{info.base_name}"
        record = read_json(fs, f"{info.path}/{RECORD}")
        rounds = _rounds_folder(fs, info.path)
        manifest = None if rounds else read_manifest(path)
        if record is None and manifest is None:
            continue
        row = {"folder": info.base_name, "start": None, "end": None, "error": None, **(record or {})}
        done = _rounds_done(path, row) if rounds else bool(manifest and manifest.get("complete"))
        state = row.get("state") or ("complete" if done else "incomplete")
        if state == "running" and not _alive(row):
            state, row["error"] = "incomplete", row["error"] or "its process is gone (killed?)"
        if state == "stopped":
            state = "incomplete"
        if state == "complete" and not done:
            state, row["error"] = "incomplete", ("its rounds are not all finished" if rounds
                                                 else "its manifest is not complete")
        if rounds:
            runs = [f"{path}/{d.name}/run" for d in sorted(Path(path).glob("round-*")) if (d / "run").is_dir()]
            row.update(state=state, responses=sum(_responses(fs, r, read_manifest(r)) for r in runs),
                       dev=summary(Path(path)), run_seconds={}, seconds={})
        else:
            run_seconds, seconds = stage_seconds(path)
            row.update(state=state, responses=_responses(fs, info.path, manifest), run_seconds=run_seconds,
                       seconds=seconds)
        if state == "incomplete":
            row["resume"] = f"tokencredit runs {out} --resume {info.base_name}"
        rows.append(row)
    for info in fs.get_file_info(pafs.FileSelector(f"{root}/{SKIPPED}", allow_not_found=True)):
        record = read_json(fs, info.path) if info.base_name.endswith(".json") else None
        if record:
            rows.append({**record, "state": "skipped", "responses": 0})
    keep = ("folder", "start", "end", "state", "responses", "error", "resume", "flow_run_name", "run_seconds",
            "seconds", "rounds", "dev")
    return sorted(({k: r.get(k) for k in keep} for r in rows), key=lambda r: (r["start"] or "", r["folder"]))


def _rounds_folder(fs: pafs.FileSystem, path: str) -> bool:
    """Whether the folder holds rounds (`serve --rounds`, in `tokencredit rounds`' layout) rather than a dataset."""
    return fs.get_file_info(f"{path}/{SETTINGS}").type == pafs.FileType.File


def _rounds_done(path: str, record: dict[str, Any]) -> bool:
    """Every one of the record's rounds finished (its dev reward written), a folder's start policy counted first."""
    return "rounds" in record and len(summary(Path(path))) >= 1 + int(record["rounds"])


def format_runs(rows: list[dict[str, Any]]) -> str:
    """A table of `list_runs`' rows, a line of each run's times (`timing.describe`), a line of each rounds job's dev
    rewards (the start policy's, then each finished round's), then one line per incomplete run saying how to
    resume it."""
    header = ("folder", "start", "end", "state", "responses", "error")
    table = [header] + [tuple("" if r[k] is None else str(r[k]) for k in header) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(header) - 1)]
    lines = ["  ".join([*(cell.ljust(w) for cell, w in zip(line, widths)), line[-1]]).rstrip() for line in table]
    lines += [f"{r['folder']}: {describe(r['run_seconds'] or {}, r['seconds'] or {})}" for r in rows
              if r.get("run_seconds") or r.get("seconds")]
    lines += [f"{r['folder']}: dev reward " + ", ".join(f"{d['round']} {d['reward']:.4f}" for d in r["dev"])
              for r in rows if r.get("dev")]
    lines += [f"{r['folder']}: incomplete; resume it with: {r['resume']}" for r in rows if r.get("resume")]
    return "\n".join(lines)


def resume(out: str, folder: str) -> str:
    """Finish the incomplete run OUT/folder, in this process without Prefect: a dataset with the config its manifest
    records (its written shards are kept), a rounds job with its rounds.json and its record's number of rounds (what
    its rounds wrote is kept). Returns the line that says what it wrote."""
    path = f"{out.rstrip('/')}/{folder}"  # `folder`: one folder name, checked where it is parsed (names.check_name)
    if "://" not in out:
        inside(out, path)  # a symbolic link OUT/FOLDER to a run elsewhere: that run is not finished from here
    fs, root = filesystem(path)
    record = read_json(fs, f"{root}/{RECORD}")
    done = _resume_rounds(path, record) if _rounds_folder(fs, root) else _resume_dataset(path)
    if record is not None:
        end_record(out, {**record, "resumed": now()}, "complete")
    return done


def _resume_dataset(path: str) -> str:
    manifest = read_manifest(path)
    if manifest is None or "config" not in manifest:
        raise FileNotFoundError(f"{path}: no manifest with a config (the run stopped before it started writing); "
                                f"nothing to resume: the next scheduled run writes a folder of its own")
    with Phase(f"runs: resuming {path} (its written shards are kept): loading torch"):
        from pydantic import TypeAdapter

        from tokencredit.pipeline.annotate import run_annotation
        from tokencredit.pipeline.config import AnnotateConfig

        config = TypeAdapter(AnnotateConfig).validate_python(manifest["config"])
    manifest = run_annotation(config, path, run_id=manifest.get("run_id"))
    return f"wrote {manifest['totals']} to {path} (complete)"


def _resume_rounds(path: str, record: dict[str, Any] | None) -> str:
    if record is None or "rounds" not in record:
        raise FileNotFoundError(f"{path}: rounds without serve's record of how many (schedule.json); finish them with "
                                f"tokencredit rounds --out {path} and the options they were started with")
    with Phase(f"runs: resuming the rounds in {path} (what they wrote is kept): loading torch"):
        from tokencredit.flows.rounds import run_rounds

        config = RoundsConfig.from_settings(json.loads((Path(path) / SETTINGS).read_text()), int(record["rounds"]))
    results = run_rounds(config, Path(path), runner="none")
    return (f"{path}: complete, dev reward {results[0]['reward']:.4f} (start) -> {results[-1]['reward']:.4f} after "
            f"round {config.rounds}")
