"""Atomic, resumable Parquet writing of a run directory, and the list of files a reader may read.

    OUT/responses/part-00003.parquet   one file per shard and table
    OUT/credits/part-00003.parquet
    OUT/nodes/part-00003.parquet       the nodes of its tree-sampled groups (empty for flat sampling)
    OUT/_shards/shard-00003.json       completion marker: rows, checksums, stats (each stage's seconds among
                                       them, `pipeline.timing`) and code version of that shard
    OUT/manifest.json                  config, input files' checksums, code version, seeds, per-shard
                                       rows and checksums; `complete` is true once every shard is written
    OUT/record_hashes.json             a hash of each annotated task record's content
    OUT/.lock                          held by the one process that writes the run
    OUT/.read_stamps.json              parts that readers or the writer verified, by their stat (`stamps`)

A shard is written table by table to a temporary name and renamed into place; it counts as
complete only once its marker exists, and the marker is written (atomically) last. A crash
therefore leaves at worst an orphan temporary file or unmarked shard files; a resume deletes
both, re-checks every marked shard's files against the checksums in its marker (a shard whose
files changed is written again), so a resumed run has no duplicates and no gaps. Markers, not
the manifest, record completion so that shards written in parallel by different processes never
race on one file. Readers take the manifest's file list (`run_files`), never a glob of the folder.
`OUT` may be a local path or any URI that `pyarrow.fs` opens (s3://, gs://, ...).
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import socket
import time
import uuid
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from tokencredit.schemas import SCHEMA_VERSION, TABLES, with_version

from tokencredit.pipeline import interrupts
from tokencredit.pipeline.dataset.stamps import STAMPS, PartStamps
from tokencredit.pipeline.timing import SECONDS

MANIFEST = "manifest.json"
RECORD_HASHES = "record_hashes.json"  # task record id -> hash of its content (`tokencredit.pipeline.identity`)
SHARDS = "_shards"
LOCK = ".lock"


def _same_file(handle, path: str) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
    except FileNotFoundError:
        return False


class IncompleteRunError(ValueError):
    """A reader asked for a run whose manifest is not complete."""


def check_restartable(out: str) -> None:
    """Raise ValueError unless OUT holds a tokencredit run (its manifest.json), or nothing but what a run
    start leaves (its empty table folders, its lock) and its readers' stamps: `--restart` deletes a run, never a
    folder of other files. Called before anything is written into OUT."""
    fs, root = filesystem(out)
    if fs.get_file_info(root).type == pafs.FileType.NotFound or _exists(fs, f"{root}/{MANIFEST}"):
        return
    found = [info.path[len(root) + 1:] for info in fs.get_file_info(pafs.FileSelector(root, recursive=True))
             if not (info.type == pafs.FileType.Directory and info.base_name in (*TABLES, SHARDS))
             and info.path[len(root) + 1:] not in (LOCK, STAMPS)]
    if found:
        shown = ", ".join(sorted(found)[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise ValueError(f"--restart: {out} holds no tokencredit run (no {MANIFEST}) but {len(found)} other "
                         f"entries ({shown}); nothing was deleted: choose another --out")


class RunLockedError(RuntimeError):
    """Another live process is writing the run directory."""


def filesystem(out: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, root path) of a local path or a URI such as s3://bucket/run."""
    if "://" in out:
        return pafs.FileSystem.from_uri(out)
    return pafs.LocalFileSystem(), str(Path(out).resolve())


def _sha256(fs: pafs.FileSystem, path: str) -> str:
    digest = hashlib.sha256()
    with fs.open_input_stream(path) as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _footer_sha256(fs: pafs.FileSystem, path: str) -> str:
    """sha256 of a Parquet file's footer (its metadata, its length and the closing magic): the footer holds every
    column chunk's offset, size and statistics, so another file's (a part copied from another shard) differs.
    Two small reads, where a full hash reads the whole part."""
    with fs.open_input_file(path) as handle:
        size = handle.size()
        tail = handle.read_at(min(size, 8), max(size - 8, 0))
        length = int.from_bytes(tail[:4], "little") + 8 if tail[4:] == b"PAR1" else len(tail)
        return hashlib.sha256(handle.read_at(min(size, length), max(size - length, 0))).hexdigest()


RESUME_RUN = ("resume the run (rerun the annotate command that wrote it: its manifest keeps each part's sha256, and "
              "shards whose files differ are written again)")
_MARKER = re.compile(r"shard-(\d{5})\.json")  # a shard's completion marker in OUT/_shards
_PART = re.compile(r"part-(\d{5})\.parquet")  # a shard's part file in OUT/TABLE
_TEMPORARY = re.compile(r"\..+\.[0-9a-f]+\.tmp")  # what `_write_atomic` names a file while writing it


def _write_atomic(fs: pafs.FileSystem, path: str, write) -> None:
    interrupts.hold()  # nothing computed while an interrupt kills the workers is written
    # a leading dot hides a half-written file from pyarrow.dataset, DuckDB globs and `datasets`
    folder, name = path.rsplit("/", 1)
    tmp = f"{folder}/.{name}.{uuid.uuid4().hex}.tmp"
    write(tmp)
    fs.move(tmp, path)


def _read_json(fs: pafs.FileSystem, path: str) -> dict[str, Any] | None:
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    with fs.open_input_stream(path) as stream:
        text = stream.read()
    try:
        return json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}); was its write cut short? "
                         "Restore it or annotate again into a new --out") from None


def read_manifest(out: str) -> dict[str, Any] | None:
    """The manifest of the run directory `out` (None when it has none), checked as `run_files` checks it."""
    return _read_manifest(*filesystem(out))


def stage_seconds(out: str) -> tuple[dict[str, Any], dict[str, float]]:
    """(the run's wall seconds, each stage's seconds summed over its shards: `pipeline.timing`) of the run in `out`:
    the manifest's once it is complete, else the shards' markers written so far (and no wall seconds)."""
    fs, root = filesystem(out)
    manifest = _read_manifest(fs, root) or {}
    if manifest.get("complete"):
        return manifest.get("run_seconds") or {}, manifest.get("stats", {}).get(SECONDS, {})
    seconds: dict[str, float] = {}
    for info in fs.get_file_info(pafs.FileSelector(f"{root}/{SHARDS}", allow_not_found=True)):
        entry = _read_marker(fs, info.path) if _MARKER.fullmatch(info.base_name) else None
        add_stats(seconds, entry["stats"].get(SECONDS, {}) if entry else {})
    return {}, seconds


def _read_manifest(fs: pafs.FileSystem, root: str) -> dict[str, Any] | None:
    """OUT/manifest.json (None when absent); ValueError naming it when it is not the object annotate writes
    (a `[]` or `{"complete": true}` failed later with a raw AttributeError or KeyError)."""
    path = f"{root}/{MANIFEST}"
    manifest = _read_json(fs, path)
    problem = None if manifest is None else _manifest_problem(manifest)
    if problem:
        raise ValueError(f"{path}: {problem}; restore it or annotate again into a new --out")
    return manifest


def _manifest_problem(manifest: Any) -> str | None:
    if not isinstance(manifest, dict):
        return f"expected a JSON object, got {type(manifest).__name__}"
    for key in ("config", "seeds", "shards", "stats", "totals"):
        if manifest.get(key) is not None and not isinstance(manifest[key], dict):
            return f"'{key}' is not an object"
    if manifest.get("complete"):
        if not isinstance(manifest.get("shards"), dict):
            return "it says complete but lists no 'shards'"
        for name, entry in manifest["shards"].items():
            problem = _entry_problem(entry)
            if problem:
                return f"shard {name}: {problem}"
    return None


def _entry_problem(entry: Any) -> str | None:
    """What is wrong with a shard's entry (its marker, or its copy in the manifest), None when nothing."""
    if not isinstance(entry, dict) or type(entry.get("shard")) is not int:
        return "expected an object with an integer 'shard'"
    for name in TABLES:
        table = entry.get(name)
        if name in entry and not (isinstance(table, dict) and isinstance(table.get("path"), str)
                                  and isinstance(table.get("sha256"), str) and type(table.get("rows")) is int):
            return f"'{name}' needs a path, a sha256 and a row count"
    return None


def _read_marker(fs: pafs.FileSystem, path: str) -> dict[str, Any] | None:
    """A shard's completion marker (None when absent); ValueError naming it when it is malformed."""
    entry = _read_json(fs, path)
    problem = None if entry is None else _entry_problem(entry)
    if problem:
        raise ValueError(f"{path}: {problem}; delete it and resume the run to write the shard again")
    return entry


def _exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


@dataclass
class RunFiles:
    """What a reader of a run may read: its manifest and, per table, the part files (full paths)."""

    fs: pafs.FileSystem
    root: str
    local: bool
    manifest: dict[str, Any]
    files: dict[str, list[str]]


def run_files(out: str, allow_incomplete: bool = False, stamp: bool = True,
              tables: tuple[str, ...] = tuple(TABLES)) -> RunFiles:
    """The part files of a run: the manifest's list once the run is complete, each of `tables` checked
    (`_check_run`; a reader that reads only some tables passes those).

    An incomplete run raises IncompleteRunError, unless `allow_incomplete`: then the files of the
    shards whose completion marker exists (never a half-written or unmarked file). `stamp=False` checks every
    part in full and writes no stamp (annotate's found-again check, which writes nothing).
    """
    fs, root = filesystem(out)
    stamps = PartStamps(root) if stamp and isinstance(fs, pafs.LocalFileSystem) else None  # before the manifest
    manifest = _read_manifest(fs, root)
    if manifest is None:
        try:
            derived = _read_json(fs, f"{root}/config.json")
        except ValueError:  # someone else's config.json
            derived = None
        if isinstance(derived, dict) and isinstance(derived.get("run"), str):  # `tokencredit values` or `repair`
            raise FileNotFoundError(f"{out} is not a tokencredit run directory (no {MANIFEST}): it holds what "
                                    f"tokencredit values or repair derived from the run {derived['run']}; pass a run")
        raise FileNotFoundError(f"{out} is not a tokencredit run directory (no {MANIFEST})")
    if manifest.get("complete"):
        entries = list(manifest["shards"].values())
    else:
        markers = fs.get_file_info(pafs.FileSelector(f"{root}/{SHARDS}", allow_not_found=True))
        entries = [_read_marker(fs, m.path) for m in markers
                   if _MARKER.fullmatch(m.base_name)]
        if not allow_incomplete:
            total = manifest.get("n_shards")
            raise IncompleteRunError(
                f"{out}: the run is not complete ({len(entries)} of {total if total is not None else '?'} shards "
                f"written); resume it with the same annotate command, or pass --allow-incomplete to read "
                f"the shards written so far")
    entries.sort(key=lambda e: e["shard"])
    _check_run(fs, out, root, manifest, entries, stamps, tables)
    files = {name: [f"{root}/{e[name]['path']}" for e in entries if name in e] for name in TABLES}
    return RunFiles(fs, root, "://" not in out, manifest, files)


def _check_run(fs: pafs.FileSystem, out: str, root: str, manifest: dict[str, Any], entries: list[dict[str, Any]],
               stamps: PartStamps | None, tables: tuple[str, ...] = tuple(TABLES)) -> None:
    """ValueError naming what a reader of `tables` must not read: a complete manifest's shard list that does not
    match the markers or the folders of `tables` (`_shard_list_problem`), or a part of `entries` in `tables` that
    is not the file its shard wrote (`_check_part`). With `stamps` (a local run's, made before its manifest was
    read), only what changed since a reader verified it is checked again: each part is stat'ed, and a folder is
    listed only when it or the manifest changed."""
    parts = [entry[name] for entry in entries for name in tables if name in entry]
    unverified = stamps.unverified(parts) if stamps is not None else [(part, None) for part in parts]
    if manifest.get("complete"):
        listed = {folder: stamps.check_holds(f"shard_list {folder}", (MANIFEST, folder)) if stamps else (False, [])
                  for folder in (SHARDS, *tables)}
        stale = [folder for folder, (holds, _) in listed.items() if not holds]
        if stale:
            problem = _shard_list_problem(manifest, _listing(fs, root, tuple(stale)))
            if problem:
                raise ValueError(f"{out}: {problem}; {RESUME_RUN}")
            if stamps is not None:
                for folder in stale:
                    stamps.add_check(f"shard_list {folder}", listed[folder][1])
    for part, stat in unverified:
        _check_part(fs, out, root, part)
        if stamps is not None and stat is not None:
            stamps.add(part, stat)
    if stamps is not None:
        stamps.save()


def _listing(fs: pafs.FileSystem, root: str, folders: tuple[str, ...] = (SHARDS, *TABLES)) -> dict[str, set[str]]:
    """The names of the files in OUT's `folders` (its marker folder, table folders), one listing each ({} for a
    folder not there)."""
    found: dict[str, set[str]] = {}
    for folder in folders:
        if isinstance(fs, pafs.LocalFileSystem):  # names only: pyarrow stats every file it lists
            try:
                found[folder] = set(os.listdir(f"{root}/{folder}"))
            except (FileNotFoundError, NotADirectoryError):
                found[folder] = set()
        else:
            selector = pafs.FileSelector(f"{root}/{folder}", allow_not_found=True)
            found[folder] = {info.base_name for info in fs.get_file_info(selector)}
    return found


def _shard_list_problem(manifest: dict[str, Any], listing: dict[str, set[str]]) -> str | None:
    """What is wrong with a complete manifest's list of shards, None when nothing: a shard of 0..n_shards-1 it does
    not list, a marker or a part file in a folder of `listing` (`_listing`) of a shard it does not list, or totals
    its shards' rows do not make (an entry deleted from the manifest read as a smaller run). One pass over its
    shards, then set differences: the pattern is matched only against names that are not a listed shard's."""
    shards = manifest["shards"]
    listed: set[int] = set()
    rows = dict.fromkeys(TABLES, 0)
    for entry in shards.values():
        listed.add(entry["shard"])
        for name in TABLES:
            if name in entry:
                rows[name] += entry[name]["rows"]
    n_shards = manifest.get("n_shards") or 0
    missing = [s for s in range(n_shards) if s not in listed or str(s) not in shards]
    if missing:
        return f"{MANIFEST} lists no shard {missing[0]} of its {n_shards} shards"
    for folder in listing:
        pattern, name = (_MARKER, "shard-{:05d}.json") if folder == SHARDS else (_PART, "part-{:05d}.parquet")
        for base_name in sorted(listing[folder] - {name.format(s) for s in listed}):
            found = pattern.fullmatch(base_name)
            if found and int(found[1]) not in listed:
                return (f"{folder}/{base_name} is a shard that {MANIFEST} does not list (move it out of the "
                        f"run folder if the run did not write it)")
    totals = manifest.get("totals") or {}
    for name in TABLES:
        if name in totals and rows[name] != totals[name]:
            return f"{MANIFEST} counts {totals[name]} {name} rows but its shards hold {rows[name]}"
    return None


def _check_part(fs: pafs.FileSystem, out: str, root: str, part: dict[str, Any], resume: str = RESUME_RUN) -> None:
    """ValueError naming a part file of the run that is gone or is not the file its shard wrote, and saying how to
    write it again (`resume`). A part written with its size and footer hash is checked by both (a stat and two
    small reads: a copied, cut-short or appended-to part differs); an older run's part, which records only its
    sha256, by that (a full read); a part recorded with its rows alone by its footer's row count. A change inside
    a page that keeps the size and the footer is found by a resume's sha256 check, not here."""
    path = f"{root}/{part['path']}"
    try:
        problem = _part_problem(fs, path, part)
    except FileNotFoundError:
        problem = "is missing"
    except (OSError, pa.ArrowInvalid):
        problem = "is not a whole Parquet file (cut short?)"
    if problem:
        raise ValueError(f"{out}: its part file {part['path']} {problem}; {resume}")


def _part_problem(fs: pafs.FileSystem, path: str, part: dict[str, Any]) -> str | None:
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return "is missing"
    if "bytes" in part:
        if info.size != part["bytes"]:
            return f"holds {info.size} bytes where the run wrote {part['bytes']} (cut short or replaced?)"
        if _footer_sha256(fs, path) != part["footer_sha256"]:
            return "is not the file the run wrote: its Parquet footer differs (copied from another shard?)"
        return None
    if "sha256" in part:
        return None if _sha256(fs, path) == part["sha256"] else "differs from the sha256 the run recorded for it"
    rows = pq.read_metadata(path, filesystem=fs).num_rows
    return None if rows == part["rows"] else f"holds {rows} rows where the run wrote {part['rows']}"


@dataclass
class RunWriter:
    """Writes the shards of one run; `manifest` mirrors OUT/manifest.json."""

    out: str
    fs: pafs.FileSystem = field(init=False)
    root: str = field(init=False)
    manifest: dict[str, Any] = field(init=False)
    _lock_handle: Any = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.fs, self.root = filesystem(self.out)
        for folder in (*TABLES, SHARDS):
            self.fs.create_dir(f"{self.root}/{folder}", recursive=True)
        self.manifest = _read_manifest(self.fs, self.root) or {"schema_version": SCHEMA_VERSION}

    def write_file(self, relpath: str, payload: bytes) -> None:
        """Write OUT/relpath atomically (temporary name, then rename)."""
        def write(tmp: str) -> None:
            with self.fs.open_output_stream(tmp) as stream:
                stream.write(payload)

        _write_atomic(self.fs, f"{self.root}/{relpath}", write)

    def _write_json(self, relpath: str, obj: dict[str, Any]) -> None:
        self.write_file(relpath, json.dumps(obj, indent=2, sort_keys=True).encode())

    # --- one writer at a time ------------------------------------------------------------------

    def lock(self) -> None:
        """Claim the run directory for this process until `unlock`: a second writer of the same
        folder is refused (RunLockedError) while this one lives. Local folders use an OS lock
        (released by the kernel even after `kill -9`); remote ones a lock object naming host and
        process, taken over once that process is gone from this host."""
        if self._lock_handle is None:
            self._lock_handle = self._acquire()

    def unlock(self) -> None:
        if self._lock_handle is not None:
            self._release(self._lock_handle)
            self._lock_handle = None

    def _owner(self) -> dict[str, Any]:
        return {"host": socket.gethostname(), "pid": os.getpid(),
                "since": datetime.datetime.now().isoformat(timespec="seconds")}

    def _locked_message(self, owner: dict[str, Any] | None) -> str:
        who = (f"process {owner.get('pid')} on {owner.get('host')} (since {owner.get('since')})"
               if owner else "another process")
        return (f"{self.out} is being written by {who}; wait for it to finish or stop it "
                f"(one writer per run directory)")

    def _acquire(self):
        path = f"{self.root}/{LOCK}"
        if isinstance(self.fs, pafs.LocalFileSystem):
            import fcntl

            handle = open(path, "a+")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                text = handle.read()
                handle.close()
                raise RunLockedError(self._locked_message(json.loads(text) if text.strip() else None)) from None
            if not _same_file(handle, path):  # its holder removed it as we opened it: lock the new one
                handle.close()
                return self._acquire()
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps(self._owner()))
            handle.flush()
            return handle
        owner = _read_json(self.fs, path)
        if owner and not _owner_is_gone(owner):
            raise RunLockedError(self._locked_message(owner))
        # object stores have no exclusive create: write, then read back to see who won
        mine = {**self._owner(), "token": uuid.uuid4().hex}
        self._write_json(LOCK, mine)
        if _read_json(self.fs, path) != mine:
            raise RunLockedError(self._locked_message(_read_json(self.fs, path)))
        return mine

    def _release(self, handle) -> None:
        if isinstance(handle, dict):
            if _read_json(self.fs, f"{self.root}/{LOCK}") == handle:
                self.fs.delete_file(f"{self.root}/{LOCK}")
        else:  # removed while still locked, so that a run that finished leaves no lock file
            if _same_file(handle, handle.name):
                os.remove(handle.name)
            handle.close()  # closing the file releases the OS lock

    def check_unlocked(self) -> None:
        """Raise RunLockedError if another live process holds the lock (without taking it)."""
        self._release(self._acquire())

    # --- writing -------------------------------------------------------------------------------

    def start(self, run_id: str, config: dict[str, Any], config_hash: str, code_version: str,
              n_shards: int | None = None, seeds: dict[str, Any] | None = None,
              inputs: dict[str, Any] | None = None) -> None:
        """Record the run's identity: its config and `inputs` (`tokencredit.pipeline.identity.run_inputs`);
        refuses to mix two configs or two versions of an input in one directory.

        `seeds` defaults to {"sampling": config["seed"]}. A complete run stays complete (a re-run
        of it writes nothing) until `resume_check` finds a shard to write again.
        """
        self.check_config(config_hash, inputs)
        previous = self.manifest.get("config_hash")
        self.manifest.update(run_id=run_id, config=config, config_hash=config_hash, code_version=code_version,
                             n_shards=n_shards, seeds=seeds if seeds is not None else {"sampling": config.get("seed")},
                             complete=bool(self.manifest.get("complete")) and previous == config_hash)
        if inputs is not None:
            self.manifest["inputs"] = inputs
        self._write_json(MANIFEST, self.manifest)

    def check_config(self, config_hash: str, inputs: dict[str, Any] | None = None) -> None:
        """Raise ValueError if the directory already holds a run of another config, or one whose
        recorded `inputs` differ from these (a run from before inputs were recorded has none)."""
        previous = self.manifest.get("config_hash")
        if previous is not None and previous != config_hash:
            raise ValueError(
                f"{self.out} already holds run {self.manifest.get('run_id')!r} with another config "
                f"(hash {previous[:12]} != {config_hash[:12]}); use a new --out, the same config, or --restart")
        recorded = self.manifest.get("inputs")
        changed = _changed_input(recorded, inputs) if recorded is not None and inputs is not None else None
        if changed:
            raise ValueError(f"{self.out} holds run {self.manifest.get('run_id')!r} of other inputs: {changed} since "
                             f"it started; annotate again with --restart to start a fresh run, or use a new --out")

    def clear(self) -> None:
        """Delete the run this directory holds (`--restart`), and only what the run wrote: its manifest,
        record hashes, rejected records, its readers' stamps, the markers and part files of its shards (by their
        exact names, for the shards its manifest and markers count) and its temporary files; anything else in OUT
        stays.
        Call it holding the lock, after `check_restartable`. A crash midway leaves the old run incomplete
        (readers refuse it) and no shard that counts as written without its files: the manifest says
        incomplete first, then markers go, then part files, then the manifest."""
        if self.manifest.get("complete"):
            self.manifest["complete"] = False
            self._write_json(MANIFEST, self.manifest)
        shards = set(range(self.manifest.get("n_shards") or 0)) | {int(s) for s in self.manifest.get("shards") or {}}
        markers = self.fs.get_file_info(pafs.FileSelector(f"{self.root}/{SHARDS}", allow_not_found=True))
        shards |= {int(m.base_name[6:11]) for m in markers if _MARKER.fullmatch(m.base_name)}
        ours = [self._marker(s) for s in sorted(shards)]
        ours += [f"{name}/part-{s:05d}.parquet" for s in sorted(shards) for name in TABLES]
        ours += ["rejected.jsonl", RECORD_HASHES, STAMPS]
        for relpath in ours:
            if self.fs.get_file_info(f"{self.root}/{relpath}").type == pafs.FileType.File:
                self.fs.delete_file(f"{self.root}/{relpath}")
        self._delete_temporaries()
        if _exists(self.fs, f"{self.root}/{MANIFEST}"):
            self.fs.delete_file(f"{self.root}/{MANIFEST}")
        self.manifest = {"schema_version": SCHEMA_VERSION}

    def resume_check(self, n_shards: int) -> list[int]:
        """Before (re)writing shards: delete temporary files, and unmark every shard whose files are
        missing or differ from the checksums in its marker. Returns the shards unmarked (they are
        written again). Call it holding the lock.

        Unmarked part files stay: they are whole files (written under a temporary name, then
        renamed), their shard's rewrite replaces them, and readers never list them. A task of a
        killed run that still runs on a Dask worker may finish a shard meanwhile; it writes the
        same bytes, and if this deletes its temporary file that task fails, and the shard is
        written here."""
        self._delete_temporaries()
        marked = {s: self._read_marker(s) for s in range(n_shards)}
        redo = [s for s, entry in marked.items() if entry is not None and not self._files_match(entry)]
        stale = self.manifest.get("complete") and _shard_list_problem(self.manifest, _listing(self.fs, self.root))
        if (redo or stale) and self.manifest.get("complete"):  # `finish` writes its list of shards again
            self.manifest["complete"] = False
            self._write_json(MANIFEST, self.manifest)
        for s in redo:
            self.fs.delete_file(f"{self.root}/{self._marker(s)}")
        return redo

    def _delete_temporaries(self) -> None:
        """Delete the temporary files `_write_atomic` leaves when killed (.NAME.<hex>.tmp), no other file."""
        for folder in ("", *TABLES, SHARDS):
            infos = self.fs.get_file_info(pafs.FileSelector(f"{self.root}/{folder}".rstrip("/"), allow_not_found=True))
            for info in infos:
                if info.type == pafs.FileType.File and _TEMPORARY.fullmatch(info.base_name):
                    self.fs.delete_file(info.path)

    def _files_match(self, entry: dict[str, Any], stamps: PartStamps | None = None) -> bool:
        """Whether every part of a shard's `entry` is there with the sha256 it records; with `stamps`, each part
        found so is stamped (`stamps.PartStamps.add`: by its stat taken before the hash)."""
        for name in TABLES:
            if name in entry:
                path = f"{self.root}/{entry[name]['path']}"
                if not _exists(self.fs, path):
                    return False
                taken_ns = time.time_ns()
                stat = os.stat(path) if stamps is not None else None
                if _sha256(self.fs, path) != entry[name]["sha256"]:
                    return False
                if stat is not None:
                    stamps.add(entry[name], stat, taken_ns)
        return True

    def _marker(self, shard: int) -> str:
        return f"{SHARDS}/shard-{shard:05d}.json"

    def _read_marker(self, shard: int) -> dict[str, Any] | None:
        return _read_marker(self.fs, f"{self.root}/{self._marker(shard)}")

    def is_complete(self, shard: int) -> bool:
        return _exists(self.fs, f"{self.root}/{self._marker(shard)}")

    def shard_entry(self, shard: int) -> dict[str, Any]:
        """The completion marker of a written shard (rows, checksums, stats)."""
        entry = self._read_marker(shard)
        if entry is None:
            raise KeyError(f"{self.out}: shard {shard} is not written")
        return entry

    def write_shard(self, shard: int, tables: dict[str, pa.Table], stats: dict[str, Any],
                    code_version: str | None = None, worker: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write every table of one shard atomically, then its completion marker (its stats get the seconds the
        tables took, `seconds.write`).

        `code_version`: of the code that computed the shard (a Dask worker may run other code
        than the process that started the run). `worker`: the process that computed it
        (`devices.worker_identity`), kept in the marker only."""
        began = time.perf_counter()
        entry: dict[str, Any] = {"shard": shard, "stats": stats, "code_version": code_version}
        if worker is not None:
            entry["worker"] = worker
        for name, table in tables.items():
            path = f"{self.root}/{name}/part-{shard:05d}.parquet"
            table = table.cast(with_version(TABLES[name], name))
            _write_atomic(self.fs, path, lambda tmp, t=table: pq.write_table(t, tmp, filesystem=self.fs))
            entry[name] = {"path": f"{name}/part-{shard:05d}.parquet", "rows": table.num_rows,
                           "sha256": _sha256(self.fs, path), "bytes": self.fs.get_file_info(path).size,
                           "footer_sha256": _footer_sha256(self.fs, path)}
        entry["stats"] = {**stats, SECONDS: {**stats.get(SECONDS, {}), "write": round(time.perf_counter() - began, 3)}}
        self._write_json(self._marker(shard), entry)
        return entry

    def checked_shards(self, n_shards: int, stamp: bool = False) -> list[dict[str, Any]]:
        """The markers of shards 0..n_shards-1, once every one exists and its files still match its
        checksums; else RuntimeError naming the shards to write again by resuming (which redoes them).
        `stamp` (a local run that is finishing): the part files found so are stamped for its readers
        (`stamps`), so that the first read after the run reads the footers of its newest parts alone."""
        entries = [self._read_marker(s) for s in range(n_shards)]
        missing = [s for s, entry in enumerate(entries) if entry is None]
        if missing:
            raise RuntimeError(f"{self.out}: shards {missing} are not written; resume the run")
        stamps = PartStamps(self.root) if stamp and isinstance(self.fs, pafs.LocalFileSystem) else None
        changed = [s for s, entry in enumerate(entries) if not self._files_match(entry, stamps)]
        if changed:
            raise RuntimeError(f"{self.out}: the files of shards {changed} differ from their checksums (changed "
                               f"after they were written); resume the run to write them again")
        if stamps is not None:
            stamps.save()
        return entries

    def finish(self, n_shards: int, extra: dict[str, Any],
               entries: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Collect the shard markers into the manifest: totals, summed stats, dataset checksum,
        `complete: true`. `entries`: what `checked_shards` returned just before (else it is called, stamping).

        Raises if a shard in range(n_shards) is missing or changed: the run is not complete. Deletes what
        writers that died mid-file left (a killed Dask worker's shard was written again elsewhere).
        """
        entries = entries if entries is not None else self.checked_shards(n_shards, stamp=True)
        # a shard of a table it does not write (a run of an older schema has no nodes) counts 0 rows
        totals = {name: sum(e[name]["rows"] for e in entries if name in e) for name in TABLES}
        checksum = hashlib.sha256("".join(e[name]["sha256"] for e in entries for name in TABLES if name in e)
                                  .encode()).hexdigest()
        stats: dict[str, Any] = {}
        for entry in entries:
            add_stats(stats, entry["stats"])
        self.manifest.update(shards={str(e["shard"]): e for e in entries}, totals=totals, stats=stats,
                             dataset_checksum=checksum, n_shards=n_shards, complete=True, **extra)
        self._write_json(MANIFEST, self.manifest)
        self._delete_temporaries()
        return self.manifest


def add_stats(total: dict[str, Any], stats: dict[str, Any]) -> None:
    """Add one shard's stats into `total`: counts, and the seconds of each stage (a dict of them)."""
    for key, value in stats.items():
        if isinstance(value, dict):
            add_stats(total.setdefault(key, {}), value)
        else:  # seconds to the millisecond, as a shard's are
            total[key] = round(total.get(key, 0) + value, 3) if isinstance(value, float) else total.get(key, 0) + value


def _changed_input(recorded: dict[str, Any], current: dict[str, Any]) -> str | None:
    """What differs between two `inputs` maps, as 'PATH changed' / 'PATH is new' / 'PATH is gone'."""
    for path, entry in current.items():
        if path not in recorded:
            return f"{path} is a new input"
        if recorded[path] != entry:
            return f"{path} changed (sha256 {recorded[path].get('sha256', '?')[:12]} -> {entry['sha256'][:12]})"
    gone = [path for path in recorded if path not in current]
    return f"{gone[0]} is no longer an input" if gone else None


def _owner_is_gone(owner: dict[str, Any]) -> bool:
    """True when the lock's process ran on this host and no longer exists."""
    if owner.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(owner["pid"]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, KeyError, ValueError, TypeError):
        return False
    return False
