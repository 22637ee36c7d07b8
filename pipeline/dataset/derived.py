"""Folders derived from a run (repair's pairs, value curves): sharded Parquet parts and their markers, each
written atomically and the marker last, under the config that made them."""
from __future__ import annotations

import dataclasses
import json

import pyarrow.fs as pafs

from tokencredit.pipeline.dataset.writer import _read_json, _write_atomic, filesystem


class DerivedStore:
    """OUT's files: its `folders` (created; a killed write's temporary files removed) and `config.json`, which
    ties OUT to one run and config: another is refused (`holds` names what OUT holds, in the message)."""

    folders: tuple[str, ...] = ()
    holds = "output"

    def __init__(self, out: str, run: str, config):
        self.out = out
        self.fs, self.root = filesystem(out)
        for folder in (*self.folders, "_shards"):
            self.fs.create_dir(f"{self.root}/{folder}", recursive=True)
            for info in self.fs.get_file_info(pafs.FileSelector(f"{self.root}/{folder}")):
                if info.base_name.startswith(".") and info.base_name.endswith(".tmp"):  # a killed write's leftover
                    self.fs.delete_file(info.path)
        run = run if "://" in run else filesystem(run)[1]  # the same run however a working directory names it
        self.digest = config.digest(run)
        known = _read_json(self.fs, f"{self.root}/config.json")
        if known is not None and known.get("digest") != self.digest:
            raise ValueError(f"{out} holds {self.holds} of another run or config ({known.get('run')}, "
                             f"{known.get('config')}); choose another --out")
        if known is None:
            self.write_json("config.json", {"run": run, "config": dataclasses.asdict(config), "digest": self.digest})

    def write_json(self, relpath: str, obj: dict) -> None:
        payload = json.dumps(obj, indent=2, sort_keys=True).encode()

        def write(tmp: str) -> None:
            with self.fs.open_output_stream(tmp) as stream:
                stream.write(payload)
        _write_atomic(self.fs, f"{self.root}/{relpath}", write)
