"""Atomic, resumable Parquet writing of a run directory.

    OUT/responses/part-00003.parquet   one file per shard and table
    OUT/credits/part-00003.parquet
    OUT/_shards/shard-00003.json       completion marker: rows and checksums of that shard
    OUT/manifest.json                  config, code version, seeds, per-shard rows and checksums

A shard is written table by table to a temporary name and renamed into place; it counts as
complete only once its marker exists, and the marker is written (atomically) last. A crash
therefore leaves at worst an orphan temporary file or unmarked shard files; both are rewritten
on resume, so a resumed run has no duplicates and no gaps. Markers, not the manifest, record
completion so that shards written in parallel by different processes never race on one file.
`OUT` may be a local path or any URI that `pyarrow.fs` opens (s3://, gs://, ...).
"""
from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from schemas import SCHEMA_VERSION, TABLES, with_version

MANIFEST = "manifest.json"
SHARDS = "_shards"


def _sha256(fs: pafs.FileSystem, path: str) -> str:
    digest = hashlib.sha256()
    with fs.open_input_stream(path) as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _write_atomic(fs: pafs.FileSystem, path: str, write) -> None:
    # a leading dot hides a half-written file from pyarrow.dataset, DuckDB globs and `datasets`
    folder, name = path.rsplit("/", 1)
    tmp = f"{folder}/.{name}.{uuid.uuid4().hex}.tmp"
    write(tmp)
    fs.move(tmp, path)


@dataclass
class RunWriter:
    """Writes the shards of one run; `manifest` mirrors OUT/manifest.json."""

    out: str
    fs: pafs.FileSystem = field(init=False)
    root: str = field(init=False)
    manifest: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        if "://" in self.out:
            self.fs, self.root = pafs.FileSystem.from_uri(self.out)
        else:
            self.fs, self.root = pafs.LocalFileSystem(), os.path.abspath(self.out)
        for folder in (*TABLES, SHARDS):
            self.fs.create_dir(f"{self.root}/{folder}", recursive=True)
        self.manifest = self._read_json(MANIFEST) or {"schema_version": SCHEMA_VERSION}

    def _read_json(self, relpath: str) -> dict[str, Any] | None:
        path = f"{self.root}/{relpath}"
        if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        with self.fs.open_input_stream(path) as stream:
            return json.loads(stream.read())

    def _write_json(self, relpath: str, obj: dict[str, Any]) -> None:
        payload = json.dumps(obj, indent=2, sort_keys=True).encode()

        def write(tmp: str) -> None:
            with self.fs.open_output_stream(tmp) as stream:
                stream.write(payload)

        _write_atomic(self.fs, f"{self.root}/{relpath}", write)

    def start(self, run_id: str, config: dict[str, Any], config_hash: str, code_version: str) -> None:
        """Record the run's identity; refuses to mix two different configs in one directory."""
        previous = self.manifest.get("config_hash")
        if previous is not None and previous != config_hash:
            raise ValueError(
                f"{self.out} already holds run {self.manifest.get('run_id')!r} with another config "
                f"(hash {previous[:12]} != {config_hash[:12]}); use a new --out or the same config")
        self.manifest.update(run_id=run_id, config=config, config_hash=config_hash,
                             code_version=code_version, seeds={"sampling": config.get("seed")})
        self._write_json(MANIFEST, self.manifest)

    def _marker(self, shard: int) -> str:
        return f"{SHARDS}/shard-{shard:05d}.json"

    def is_complete(self, shard: int) -> bool:
        return self.fs.get_file_info(f"{self.root}/{self._marker(shard)}").type != pafs.FileType.NotFound

    def shard_entry(self, shard: int) -> dict[str, Any]:
        """The completion marker of a written shard (rows, checksums, stats)."""
        entry = self._read_json(self._marker(shard))
        if entry is None:
            raise KeyError(f"{self.out}: shard {shard} is not written")
        return entry

    def write_shard(self, shard: int, tables: dict[str, pa.Table], stats: dict[str, Any]) -> dict[str, Any]:
        """Write every table of one shard atomically, then its completion marker."""
        entry: dict[str, Any] = {"shard": shard, "stats": stats}
        for name, table in tables.items():
            path = f"{self.root}/{name}/part-{shard:05d}.parquet"
            table = table.cast(with_version(TABLES[name], name))
            _write_atomic(self.fs, path, lambda tmp, t=table: pq.write_table(t, tmp, filesystem=self.fs))
            entry[name] = {"path": f"{name}/part-{shard:05d}.parquet", "rows": table.num_rows,
                           "sha256": _sha256(self.fs, path)}
        self._write_json(self._marker(shard), entry)
        return entry

    def finish(self, n_shards: int, extra: dict[str, Any]) -> dict[str, Any]:
        """Collect the shard markers into the manifest: totals, summed stats, dataset checksum.

        Raises if a shard in range(n_shards) is missing: the run is not complete.
        """
        entries = [self._read_json(self._marker(s)) for s in range(n_shards)]
        missing = [s for s, entry in enumerate(entries) if entry is None]
        if missing:
            raise RuntimeError(f"{self.out}: shards {missing} are not written; resume the run")
        totals = {name: sum(e[name]["rows"] for e in entries) for name in TABLES}
        checksum = hashlib.sha256("".join(e[name]["sha256"] for e in entries for name in TABLES)
                                  .encode()).hexdigest()
        stats: dict[str, float] = {}
        for entry in entries:
            for key, value in entry["stats"].items():
                stats[key] = stats.get(key, 0) + value
        self.manifest.update(shards={str(e["shard"]): e for e in entries}, totals=totals, stats=stats,
                             dataset_checksum=checksum, **extra)
        self._write_json(MANIFEST, self.manifest)
        return self.manifest
