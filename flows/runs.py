"""What `tokencredit serve` ran under its `--out`: one record per scheduled run, read by `tokencredit runs`.

    OUT/<folder>/schedule.json    a scheduled run: Prefect's flow run, start, end, state, error line
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
from typing import Any

import pyarrow.fs as pafs

from tokencredit.pipeline.dataset.writer import filesystem, read_manifest, stage_seconds
from tokencredit.pipeline.names import inside
from tokencredit.pipeline.progress import Phase
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
    seconds and each stage's seconds (`writer.stage_seconds`), and for an incomplete one `resume`, the command that
    finishes it. A folder with a dataset but no
    schedule record (an `annotate` into OUT) is listed by its manifest."""
    fs, root = filesystem(out)
    if fs.get_file_info(root).type != pafs.FileType.Directory:
        raise FileNotFoundError(f"{out}: no such folder (the --out of tokencredit serve)")
    rows = []
    for info in fs.get_file_info(pafs.FileSelector(root)):
        if info.type != pafs.FileType.Directory or info.base_name.startswith((".", "_")):
            continue
        record = read_json(fs, f"{info.path}/{RECORD}")
        manifest = read_manifest(f"{out.rstrip('/')}/{info.base_name}")
        if record is None and manifest is None:
            continue
        row = {"folder": info.base_name, "start": None, "end": None, "error": None, **(record or {})}
        state = row.get("state") or ("complete" if manifest and manifest.get("complete") else "incomplete")
        if state == "running" and not _alive(row):
            state, row["error"] = "incomplete", row["error"] or "its process is gone (killed?)"
        if state == "stopped":
            state = "incomplete"
        if state == "complete" and not (manifest and manifest.get("complete")):
            state, row["error"] = "incomplete", "its manifest is not complete"
        run_seconds, seconds = stage_seconds(f"{out.rstrip('/')}/{info.base_name}")
        row.update(state=state, responses=_responses(fs, info.path, manifest), run_seconds=run_seconds, seconds=seconds)
        if state == "incomplete":
            row["resume"] = f"tokencredit runs {out} --resume {info.base_name}"
        rows.append(row)
    for info in fs.get_file_info(pafs.FileSelector(f"{root}/{SKIPPED}", allow_not_found=True)):
        record = read_json(fs, info.path) if info.base_name.endswith(".json") else None
        if record:
            rows.append({**record, "state": "skipped", "responses": 0})
    keep = ("folder", "start", "end", "state", "responses", "error", "resume", "flow_run_name", "run_seconds",
            "seconds")
    return sorted(({k: r.get(k) for k in keep} for r in rows), key=lambda r: (r["start"] or "", r["folder"]))


def format_runs(rows: list[dict[str, Any]]) -> str:
    """A table of `list_runs`' rows, a line of each run's times (`timing.describe`), then one line per incomplete
    run saying how to resume it."""
    header = ("folder", "start", "end", "state", "responses", "error")
    table = [header] + [tuple("" if r[k] is None else str(r[k]) for k in header) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(header) - 1)]
    lines = ["  ".join([*(cell.ljust(w) for cell, w in zip(line, widths)), line[-1]]).rstrip() for line in table]
    lines += [f"{r['folder']}: {describe(r['run_seconds'] or {}, r['seconds'] or {})}" for r in rows
              if r.get("run_seconds") or r.get("seconds")]
    lines += [f"{r['folder']}: incomplete; resume it with: {r['resume']}" for r in rows if r.get("resume")]
    return "\n".join(lines)


def resume(out: str, folder: str) -> dict[str, Any]:
    """Finish the incomplete run OUT/folder with the config its manifest records (its written shards are
    kept); returns the manifest. Runs in this process, without Prefect."""
    path = f"{out.rstrip('/')}/{folder}"  # `folder`: one folder name, checked where it is parsed (names.check_name)
    if "://" not in out:
        inside(out, path)  # a symbolic link OUT/FOLDER to a run elsewhere: that run is not finished from here
    manifest = read_manifest(path)
    if manifest is None or "config" not in manifest:
        raise FileNotFoundError(f"{path}: no manifest with a config (the run stopped before it started writing); "
                                f"nothing to resume: the next scheduled run writes a folder of its own")
    with Phase(f"runs: resuming {path} (its written shards are kept): loading torch"):
        from pydantic import TypeAdapter

        from tokencredit.pipeline.annotate import run_annotation
        from tokencredit.pipeline.config import AnnotateConfig

        config = TypeAdapter(AnnotateConfig).validate_python(manifest["config"])
    fs, root = filesystem(path)
    record = read_json(fs, f"{root}/{RECORD}")
    result = run_annotation(config, path, run_id=manifest.get("run_id"))
    if record is not None:
        end_record(out, {**record, "resumed": now()}, "complete")
    return result
