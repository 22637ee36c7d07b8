"""Folders derived from a run (repair's pairs, value curves): sharded Parquet parts and their markers, each
written atomically and the marker last, under the config that made them; and the loop that fills one.

A kind of derived folder (`DerivedKind`) plans a job from the run (`prepare`: its shards of items, the
policy, `run_window`), and sums the shards' markers into OUT's summary (`finish`). Shards are the unit of writing
and resuming; a window of consecutive shards (`DerivedJob.windows`) the unit of sampling. `run_derived` runs the
windows in this process; `flows/derived.py` runs them as Prefect tasks.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow.fs as pafs

from tokencredit.pipeline.dataset.writer import MANIFEST, _read_json, _write_atomic, filesystem


def run_identity(run: str, allow_incomplete: bool = False) -> dict:
    """What ties a folder derived from a run (values, repair pairs, training checkpoints) to that run: its id, config
    hash, a hash of its inputs' checksums and its dataset checksum (None while the run is incomplete). A run written
    again into the same folder (`annotate --restart`, another seed or an edited prompt file) has another identity,
    so what was derived from the earlier one is refused."""
    from tokencredit.pipeline.dataset.writer import run_files

    manifest = run_files(run, allow_incomplete=allow_incomplete).manifest
    inputs = json.dumps(manifest.get("inputs") or {}, sort_keys=True).encode()
    return {"run_id": manifest.get("run_id"), "config_hash": manifest.get("config_hash"),
            "inputs_sha256": hashlib.sha256(inputs).hexdigest(), "dataset_checksum": manifest.get("dataset_checksum")}


def _root(path: str) -> str:
    """A folder as one string however it is named: the resolved path, or the URI without a trailing slash."""
    return path.rstrip("/") if "://" in path else filesystem(path)[1]


def check_outside(out: str, run: str) -> None:
    """ValueError when `out` is the run folder or inside it, or is (or is inside) the folder of another run: a
    derived folder's files (config.json, _shards/) would mix with the run's. Raised before anything is written."""
    out_root, run_root = _root(out), _root(run)
    if out_root == run_root or out_root.startswith(run_root + "/"):
        raise ValueError(f"--out {out} is {'the run folder' if out_root == run_root else 'inside the run folder'} "
                         f"{run}; choose a folder outside the run")
    other = _enclosing_run(out)
    if other is not None:
        where = "the folder of another run" if other == filesystem(out)[1] else f"inside {other}, another run's folder"
        raise ValueError(f"--out {out} is {where} (it holds {MANIFEST} and _shards/); choose a folder outside any run")


def _enclosing_run(out: str) -> str | None:
    """The folder of a run (its manifest and _shards/, as annotate writes them) that `out` is or lies in, or None."""
    fs, root = filesystem(out)
    parts = root.rstrip("/").split("/")
    for end in range(len(parts), 0, -1):
        folder = "/".join(parts[:end])
        found = fs.get_file_info([f"{folder}/{MANIFEST}", f"{folder}/_shards"])
        if found[0].type == pafs.FileType.File and found[1].type == pafs.FileType.Directory:
            return folder
    return None


def check_derived_from(folder: str, run: str, store: type[DerivedStore], option: str) -> dict:
    """The config.json of `folder` (written by `store`, a `DerivedStore`) once it says the folder was derived from
    `run` as it is now (`run_identity`); else ValueError naming `option`: not such a folder (none, or one of another
    kind: it lacks the store's folders), another run, or an earlier run in the same run folder."""
    fs, root = filesystem(folder)
    holds = store.holds
    known = _read_json(fs, f"{root}/config.json")
    if not isinstance(known, dict) or "run" not in known:
        raise ValueError(f"{option} {folder} holds no {holds} (no config.json of tokencredit's); make it with "
                         f"tokencredit {holds} {run} --out DIR")
    missing = [name for name in store.folders if fs.get_file_info(f"{root}/{name}").type != pafs.FileType.Directory]
    if missing:
        raise ValueError(f"{option} {folder} holds no {holds} (no {missing[0]}/: a folder of another kind?); make "
                         f"it with tokencredit {holds} {run} --out DIR")
    problem = _identity_problem(known, _root(run), run_identity(run))
    if problem:
        raise ValueError(f"{option} {folder} holds {holds} of {problem}; make them again with tokencredit {holds} {run} "
                         f"--out DIR")
    return known


def _identity_problem(known: dict, run_root: str, identity: dict) -> str | None:
    """Why a derived folder's recorded run (`known`: its config.json) is not `run_root` with `identity`, or None."""
    if known.get("run") != run_root:
        return f"another run ({known.get('run')})"
    recorded = known.get("identity")
    if recorded != identity:
        was = (f"run id {recorded.get('run_id')}, dataset {str(recorded.get('dataset_checksum'))[:12]}"
               if isinstance(recorded, dict) else "no run identity recorded")
        return (f"an earlier run in {run_root} ({was}; the folder now holds run id {identity['run_id']}, dataset "
                f"{str(identity['dataset_checksum'])[:12]}: written again since, e.g. by annotate --restart)")
    return None


class DerivedStore:
    """OUT's files: its `folders` (created; a killed write's temporary files removed) and `config.json`, which
    ties OUT to one run (its path and `run_identity`) and config: another is refused before anything is written
    (`holds` names what OUT holds, in the message), and so is an OUT equal to or inside the run folder."""

    folders: tuple[str, ...] = ()
    holds = "output"

    def __init__(self, out: str, run: str, config):
        check_outside(out, run)
        self.out = out
        self.fs, self.root = filesystem(out)
        run, identity = _root(run), run_identity(run)  # the same run however a working directory names it
        self.digest = hashlib.sha256(json.dumps({"run": run, "identity": identity, **dataclasses.asdict(config)},
                                                sort_keys=True).encode()).hexdigest()
        known = _read_json(self.fs, f"{self.root}/config.json")
        if known is not None and known.get("digest") != self.digest:
            problem = _identity_problem(known, run, identity) or f"another config ({known.get('config')})"
            raise ValueError(f"{out} holds {self.holds} of another run or config: {problem}; choose another --out")
        for folder in (*self.folders, "_shards"):
            self.fs.create_dir(f"{self.root}/{folder}", recursive=True)
            for info in self.fs.get_file_info(pafs.FileSelector(f"{self.root}/{folder}")):
                if info.base_name.startswith(".") and info.base_name.endswith(".tmp"):  # a killed write's leftover
                    self.fs.delete_file(info.path)
        self.identity = identity
        if known is None:
            self.write_json("config.json", {"run": run, "identity": identity, "config": dataclasses.asdict(config),
                                            "digest": self.digest})

    def claim_sampler(self, backend: str, device: str) -> None:
        """Record in config.json the sampler that fills OUT's shards (their continuations, and with the engine its
        windows, depend on it), or refuse another one: a folder of shards from two samplers is no run's bytes.
        `backend`: resolved (`choice.resolved_backend`); `device`: its type counts (cuda:1 resumes cuda:0)."""
        sampler = {"backend": backend, "device": str(device).split(":")[0]}
        known = _read_json(self.fs, f"{self.root}/config.json")
        was = known.get("sampler")
        if was is None:  # a new folder, or one written before samplers were recorded
            self.write_json("config.json", {**known, "sampler": sampler})
        elif was != sampler:
            raise ValueError(f"{self.out} holds shards sampled by {was['backend']} on {was['device']}, this run would "
                             f"sample with {backend} on {device}; give --backend {was['backend']} --device "
                             f"{was['device']} to resume it, or another --out")

    def write_json(self, relpath: str, obj: dict) -> None:
        payload = json.dumps(obj, indent=2, sort_keys=True).encode()

        def write(tmp: str) -> None:
            with self.fs.open_output_stream(tmp) as stream:
                stream.write(payload)
        _write_atomic(self.fs, f"{self.root}/{relpath}", write)


def run_sampling(run: str):
    """(the run's manifest config, its SamplingConfig); IncompleteRunError for a run still being written."""
    from tokencredit.pipeline.config import SamplingConfig
    from tokencredit.pipeline.dataset.writer import run_files

    settings = run_files(run).manifest["config"]
    sampling = settings["sampling"]
    return settings, SamplingConfig(**{**sampling, "stop": tuple(sampling.get("stop") or ()),
                                       **({"tree": tuple(sampling["tree"])} if sampling.get("tree") else {})})


@dataclass
class DerivedJob:
    """What every shard of one derived run needs: the run's sampling and verifier settings, and `shards`
    (lists of items). A kind subclasses it with its `store` and `fill` (a shard's items -> what its store's
    `write_shard` takes, and the shard's counts)."""

    run: str
    out: str
    config: Any
    shards: list[list]
    sampling: Any  # SamplingConfig
    model: str | None
    timeout_s: float
    memory_bytes: int
    store: ClassVar[type[DerivedStore]]

    @classmethod
    def plan(cls, run: str, out: str, config, items: Sequence, settings: dict, sampling):
        """`items` split into shards of `config.shard_size`; OUT created (or checked) for this run and config."""
        from tokencredit.pipeline.config import AnnotateConfig

        cls.store(out, run, config)
        shards = [list(items[i:i + config.shard_size]) for i in range(0, len(items), config.shard_size)]
        return cls(run, out, config, shards, sampling, settings.get("model"), settings.get("verifier_timeout_s", 5.0),
                   settings.get("verifier_memory_bytes", AnnotateConfig.verifier_memory_bytes))

    def windows(self, backend: str, device: str) -> list[list[int]]:
        """The shards filled together (`fill_window`), consecutive: one each. A kind whose shards are too small to
        fill the engine's batch (`repair`) takes windows of several (`engine_loop.shard_windows`). `backend`: the
        sampler's, resolved (`choice.resolved_backend`)."""
        return [[s] for s in range(len(self.shards))]

    def run_window(self, window: Sequence[int], records: dict, refs, models, backend: str) -> list[dict]:
        """Fill and write the shards of `window` not yet done, each marker last as it is filled; every shard's
        marker, in window order. A window partly written is filled whole (`fill_window` samples its written shards
        too): its requests are then batched as in the uninterrupted run, which makes the same bytes."""
        store = self.store(self.out, self.run, self.config)
        markers = {s: store.done(s) for s in window}
        todo = [s for s in window if markers[s] is None]
        if todo:
            for s, (written, counts) in self.fill_window(window, todo, records, refs, models, backend):
                markers[s] = store.write_shard(s, written, counts)
        return [markers[s] for s in window]

    def fill_window(self, window: Sequence[int], todo: Sequence[int], records: dict, refs, models,
                    backend: str) -> Iterator[tuple[int, tuple[Any, dict]]]:
        """(shard, what `fill` returns) for each shard of `todo`, each yielded once filled (it is written before
        the next is filled); here one `fill` per shard."""
        for s in todo:
            yield s, self.fill(self.shards[s], records, refs, *models)

    def fill(self, items: list, records: dict, refs, sampler, tokenizer) -> tuple[Any, dict]:
        raise NotImplementedError


@dataclass(frozen=True)
class DerivedKind:
    name: str  # "repair" | "values": the progress bar's and the Prefect flow's name
    unit: str  # what one item of a shard is, for progress
    prepare: Callable[[str, str, Any], DerivedJob]  # (run, out, config) -> the job
    finish: Callable[[DerivedJob, Sequence[dict]], dict]  # (job, shard markers) -> the summary, written to OUT
    tokens: Callable[[dict], int]  # a shard marker -> the tokens it sampled, for progress


def run_derived(kind: DerivedKind, run: str, out: str, config, device: str = "cpu", progress: bool = True,
                backend: str = "transformers") -> dict:
    """Every shard of `kind` not yet done under `out`, in this process, a window at a time (`DerivedJob.windows`);
    returns the summary. `backend`: the sampler's (`sample.load_sampler`)."""
    from tokencredit.pipeline.dataset.export import run_records
    from tokencredit.pipeline.progress import Progress
    from tokencredit.pipeline.sample import load_sampler
    from tokencredit.pipeline.sample.choice import resolved_backend

    job = kind.prepare(run, out, config)
    records, _, refs = run_records(run)
    store, models, markers, backend = job.store(out, run, config), None, [], resolved_backend(backend, device)
    store.claim_sampler(backend, device)
    with Progress(kind.name, total=sum(map(len, job.shards)), unit=kind.unit, enabled=progress) as bar:
        for window in job.windows(backend, device):
            if models is None and any(store.done(s) is None for s in window):  # load the policy only when needed
                models = load_sampler(backend, job.model, device)
            for marker in job.run_window(window, records, refs, models, backend):
                markers.append(marker)
                bar.update(len(job.shards[marker["shard"]]), tokens=kind.tokens(marker))
    return kind.finish(job, markers)
