"""What a run read, by content: the checksums that join its config in the run's identity.

A run's config names its inputs (the prompt file or folder, the SQLite databases its records use,
the policy's and the reward model's folders; plugin verifiers are in the config with their source
hashes). `run_inputs` maps each file the run reads to its size and sha256; the manifest records that
map as `inputs`, and a resume whose inputs changed is refused (`annotate --restart` starts over).
Hashing a policy's gigabytes on every resume would cost seconds, so the hash of a file larger than
FULL_HASH_BYTES is kept in `$TOKENCREDIT_HOME/hashes.json` by (resolved path, size, mtime, ctime, inode) beside a
sample hash of its content, and computed again when one of them changes; smaller files are hashed whole every
time (`file_checksums` says what is trusted).

`record_hashes` gives each task record a hash of what it says (id, task, prompt, references, spec;
not the folder its database lies in, so that a moved prompt set still matches); the run keeps them
in `OUT/record_hashes.json`, so that export and repair refuse a record that changed since the run.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokencredit.schemas.records import SqlSpec, TaskRecord
from tokencredit.verifiers.formats import source_files
from tokencredit.verifiers.tasks import DEMO, demo_dir

from tokencredit.pipeline.config import AnnotateConfig
from tokencredit.pipeline.models.registry import home

def _cache_path() -> Path:
    return home() / "hashes.json"


def _read_cache() -> dict[str, Any]:
    try:
        cache = json.loads(_cache_path().read_text())
    except (OSError, ValueError):  # none yet, or cut short: it is only a cache
        return {}
    return cache if isinstance(cache, dict) else {}


def _write_cache(cache: dict[str, Any]) -> None:
    folder = _cache_path().parent
    cache = {key: sha for key, sha in cache.items() if os.path.exists(key.split("\x00")[0])}  # forget gone files
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, prefix=".hashes.", suffix=".tmp", delete=False) as f:
            json.dump(cache, f)
        os.replace(f.name, _cache_path())  # atomic: a concurrent run reads the old or the new cache
    except OSError:  # a read-only home only costs a rehash next time
        pass


FULL_HASH_BYTES = 64 << 20  # files up to this size are hashed whole on every run (a 64 MB prompt file: ~0.1 s)
_SAMPLE_BLOCKS, _SAMPLE_BYTES = 16, 1 << 16  # the sample hash of a larger file: 16 blocks of 64 KiB


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def sample_hash(path: Path, size: int) -> str:
    """sha256 of `_SAMPLE_BLOCKS` blocks of the file spread evenly from its first byte to its last (about 1 MB read
    whatever its size): an edit inside a sampled block changes it, whatever the file's times say."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for i in range(_SAMPLE_BLOCKS):
            f.seek(max(0, size - _SAMPLE_BYTES) * i // (_SAMPLE_BLOCKS - 1))
            digest.update(f.read(_SAMPLE_BYTES))
    return digest.hexdigest()


def file_checksums(paths: Sequence[Path]) -> dict[str, dict[str, Any]]:
    """{absolute path: {"size": bytes, "sha256": hex}} of each file.

    What is trusted: a file up to FULL_HASH_BYTES (prompt files, most databases) is hashed whole every time,
    trusting nothing. A larger one (a model's weights) is hashed again unless the cache holds it under the same
    (path, size, mtime, ctime, inode) and the same `sample_hash`: an edit changes the file's ctime, which the
    kernel sets and a user cannot put back (`touch -r` and os.utime restore mtime only), and an edit inside a
    sampled block changes the sample even where a file system's times cannot be relied on."""
    cache, out, fresh = _read_cache(), {}, False
    for path in paths:
        resolved = path.resolve()
        stat = resolved.stat()
        if stat.st_size <= FULL_HASH_BYTES:
            sha = _sha256(resolved)
        else:
            key = "\x00".join(map(str, (resolved, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)))
            sample, entry = sample_hash(resolved, stat.st_size), cache.get(key)
            if not (isinstance(entry, dict) and entry.get("sample") == sample and isinstance(entry.get("sha256"), str)):
                cache[key], fresh = {"sha256": _sha256(resolved), "sample": sample}, True
            sha = cache[key]["sha256"]
        out[str(path.absolute())] = {"size": stat.st_size, "sha256": sha}
    if fresh:
        _write_cache(cache)
    return out


def _model_files(model: str | None, default: Path) -> list[Path]:
    from tokencredit.pipeline.models.loading import resolve_model_path

    folder = resolve_model_path(model, default)
    return sorted(p for p in folder.iterdir() if p.is_file())


def input_files(config: AnnotateConfig, records: Sequence[TaskRecord]) -> list[Path]:
    """The files a run of `config` over `records` reads: prompt files, the databases of its SQL
    records, the policy's folder and (with P2T) the reward model's."""
    from tokencredit.pipeline.models.loading import DEFAULT_POLICY, DEFAULT_REWARD_MODEL

    prompts = demo_dir() if config.prompts == DEMO else Path(config.prompts)
    files = source_files(prompts, config.format)
    files += sorted({Path(r.spec.db_path) for r in records if isinstance(r.spec, SqlSpec)})
    files += _model_files(config.model, DEFAULT_POLICY)
    if "p2t" in config.credit.kinds:
        files += _model_files(config.reward_model, DEFAULT_REWARD_MODEL)
    return files


def run_inputs(config: AnnotateConfig, records: Sequence[TaskRecord]) -> dict[str, dict[str, Any]]:
    """What the manifest records as `inputs`: every input file with its size and sha256."""
    return file_checksums(input_files(config, records))


def found_complete(config: AnnotateConfig, out: str, backends: Sequence[str]) -> dict[str, Any] | None:
    """The manifest of `out` when it holds a complete run of `config` under one of `backends` (`--backend auto`
    chooses after reading the prompt set), every input it recorded unchanged (its prompt files among them) and every
    shard's files as written; else None. Reads no prompt and loads no model: a rerun that would write nothing
    says so in a few seconds (`annotate` runs the full checks otherwise)."""
    from tokencredit.pipeline.dataset.writer import RunWriter, read_manifest, run_files

    manifest = read_manifest(out) or {}  # read first: a RunWriter makes the run's folders
    digests = {dataclasses.replace(config, backend=backend).digest() for backend in backends}
    recorded = manifest.get("inputs")
    if not manifest.get("complete") or manifest.get("config_hash") not in digests or not recorded:
        return None
    prompts = demo_dir() if config.prompts == DEMO else Path(config.prompts)
    if not {str(path.absolute()) for path in source_files(prompts, config.format)} <= set(recorded):
        return None
    try:
        if file_checksums([Path(path) for path in recorded]) != recorded:
            return None
        RunWriter(out).checked_shards(manifest["n_shards"])
        run_files(out, stamp=False)  # the manifest's shard list and parts as a reader checks them
    except (OSError, RuntimeError, ValueError):  # an input gone or a shard to write again: the full checks say which
        return None
    return manifest


def record_hash(record: TaskRecord) -> str:
    """sha256 (16 hex digits) of what a record says; an SQL record's database by its file name only."""
    fields = dataclasses.asdict(record)
    if isinstance(record.spec, SqlSpec):
        fields["spec"]["db_path"] = Path(record.spec.db_path).name
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def record_hashes(records: Sequence[TaskRecord]) -> dict[str, str]:
    return {r.id: record_hash(r) for r in records}


def changed_record(recorded: dict[str, str], records: Sequence[TaskRecord]) -> str | None:
    """The id of the first of `records` that the run annotated with other content, else None."""
    return next((r.id for r in records if r.id in recorded and recorded[r.id] != record_hash(r)), None)
