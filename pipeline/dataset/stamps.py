"""What readers of a local run have verified, by stat stamps, so that a part is read once after each change
instead of on every read, and the folders are listed only when they changed (`writer.run_files`).

    OUT/.read_stamps.json   {"parts": {"credits/part-00003.parquet": "st_ino st_ctime_ns the sha256 it matched"},
                             "checks": {"shard_list credits": [["manifest.json", st_ino, st_ctime_ns],
                                                               ["credits", st_ino, st_ctime_ns]], ...}}

A reader that verified a part (its size and footer sha256 against what its shard recorded) adds the part's stamp;
a later reader whose stat of the part gives the same stamp and the size its shard recorded, and whose manifest
expects the same sha256, skips the footer read. The stamp moves whenever the file could have: the kernel sets a
file's ctime on every write, truncation, `cp` over it, chmod, utime (so on every change of its mtime) or link, and
no call lets a user set it; a file renamed into place (a resume rewriting a shard, `mv`) is another inode. The
shard-list check is stamped per folder (the markers', each table's: a query of one table lists only the folders it
needs), by the manifest's stamp and the folder's (a folder's ctime moves when an entry is added, removed or renamed
in it). One race stays: a change within one tick of the filesystem's clock after a stat
may keep the ctime a stat saw (git's "racily clean" files). So a stamp is added only for what has a ctime
SETTLED_NS older than the read's start, and a later change, which gets a later tick, always moves it.

Readers write the file, and so does the run's writer as it finishes the run (`RunWriter.checked_shards` with
`stamp`), for each part its full sha256 check found as written, by the same rule with the time just before that
part's stat: the first read after a write reads the footers of only the parts written in the last SETTLED_NS before
the writer's check reached them (it hashes them oldest first), and lists the folders once (the manifest is written
last). Not the parts as they are written: a stamp then would be a racily clean one. The file is written only when
something was added (a read of a verified run writes nothing), under a temporary name and renamed into place, so a
reader never sees half of it; two readers writing at once lose one's additions, which the next read verifies again.
The temporary name is one that a resume's clean-up of killed writes deletes. A folder that cannot be written
(read-only, disk full) keeps every read verifying in full, silently. On a network filesystem a change made from
another host shows in a stat only once the client's attribute cache expires (NFS: up to a minute); until then a
reader may skip that part. A part's stamp is one string, which parses three times quicker than a list of three
(the file is parsed on every read: 6,512 parts on a 20M-row run of annotate's default shards).
"""
from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

STAMPS = ".read_stamps.json"  # hidden, like the run's temporary files, from globs of the run folder
# above the coarsest file timestamps in use (1 s: ext3, HFS+) and Linux's clock tick (1-10 ms)
SETTLED_NS = 2_000_000_000


class PartStamps:
    """The stamps of one local run folder `root`, as one read sees them: `unverified` sorts a read's parts, `add`
    records each that was then verified, `check_holds` and `add_check` do the same for a check over several
    files or folders (the shard list: the manifest and the folder listings), `save` writes them. Make it before
    the read reads anything it checks. A part is its shard's entry for one table: its `path` under OUT and `bytes`
    with `footer_sha256`, or (an older run) `sha256` alone."""

    def __init__(self, root: str) -> None:
        self.root, self.path = root, f"{root}/{STAMPS}"
        self.settled = time.time_ns() - SETTLED_NS  # before anything is read or stat'ed (module docstring)
        self.known, self.checks = _load(self.path)
        self.added: dict[str, str] = {}
        self.added_checks: dict[str, list[Any]] = {}

    def unverified(self, parts: list[dict[str, Any]]) -> list[tuple[dict[str, Any], os.stat_result | None]]:
        """The parts to verify, each with its stat (None: it could not be stat'ed, or records nothing to check
        against): every part but those whose size is the one recorded and whose stamp holds. One stat a part, by
        its path relative to OUT (from an open handle of OUT: the kernel walks two names a part, not the whole
        path)."""
        try:
            folder = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:  # `_check_part` names what is wrong
            return [(part, None) for part in parts]
        known, stat, todo = self.known, os.stat, []
        try:
            for part in parts:
                path = part["path"]
                expected = _expected(part)
                try:
                    found = stat(path.lstrip("/"), dir_fd=folder)  # what f"{OUT}/{path}" names
                except (OSError, ValueError):
                    todo.append((part, None))
                    continue
                if expected is None:
                    todo.append((part, None))
                elif (known.get(path) != _part_stamp(found, expected)
                      or found.st_size != part.get("bytes", found.st_size)):
                    todo.append((part, found))
        finally:
            os.close(folder)
        return todo

    def add(self, part: dict[str, Any], stat: os.stat_result, taken_ns: int | None = None) -> None:
        """Record that `part`, as `stat` (taken before it was verified) saw it, is the file its shard wrote.
        `taken_ns`: `time.time_ns()` just before that stat, where it is later than this object's making (a
        check that reads for a while: the parts it reads last have had longer to settle)."""
        expected = _expected(part)
        settled = self.settled if taken_ns is None else taken_ns - SETTLED_NS
        if stat.st_ctime_ns < settled and expected is not None:
            self.added[part["path"]] = _part_stamp(stat, expected)

    def check_holds(self, name: str, relpaths: tuple[str, ...]) -> tuple[bool, list[list[Any]]]:
        """Whether the check `name` passed when the files and folders `relpaths` (under OUT) had the stamps they
        have now, and those stamps (a folder's moves when an entry is added, removed or renamed in it; a missing
        one is [path, None, None]). Take them before reading what the check reads."""
        now = [[relpath, *_stamp(f"{self.root}/{relpath}")] for relpath in relpaths]
        return self.checks.get(name) == now, now

    def add_check(self, name: str, stamps: list[list[Any]]) -> None:
        """Record that the check `name` passed on what had `stamps` (`check_holds`'s)."""
        if all(ctime is None or ctime < self.settled for _, _, ctime in stamps):
            self.added_checks[name] = stamps

    def save(self) -> None:
        """Write the stamps with those added, when any were; nothing when the folder cannot be written."""
        if not self.added and not self.added_checks:
            return
        tmp = f"{self.path}.{uuid.uuid4().hex}.tmp"
        try:
            text = json.dumps({"parts": {**self.known, **self.added}, "checks": {**self.checks, **self.added_checks}},
                              separators=(",", ":"))  # in one go: json.dump to a file encodes in Python, twice as slow
            with open(tmp, "x") as handle:
                handle.write(text)
            os.replace(tmp, self.path)
        except OSError:  # read-only, full, or a resume's clean-up took the temporary file
            try:
                os.remove(tmp)
            except OSError:
                pass


def _expected(part: dict[str, Any]) -> str | None:
    """What a part is verified against: its footer's sha256 (its size is compared on every read), else its
    sha256; 16 hex digits of it, enough to tell one shard's record from another's and quicker to load."""
    expected = part.get("footer_sha256") if "bytes" in part else part.get("sha256")
    return expected[:16] if isinstance(expected, str) else None


def _part_stamp(stat: os.stat_result, expected: str) -> str:
    return f"{stat.st_ino} {stat.st_ctime_ns} {expected}"


def _stamp(path: str) -> tuple[int | None, int | None]:
    try:
        stat = os.stat(path)
    except (OSError, ValueError):
        return None, None
    return stat.st_ino, stat.st_ctime_ns


def _load(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The part stamps and check stamps in `path`; none when it is absent, unreadable or not what `save` writes."""
    try:
        with open(path, "rb") as handle:
            stamps = json.loads(handle.read())
        parts, checks = stamps.get("parts"), stamps.get("checks")
    except (OSError, ValueError, AttributeError):
        return {}, {}
    return parts if isinstance(parts, dict) else {}, checks if isinstance(checks, dict) else {}
