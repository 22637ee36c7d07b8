"""Names that a user or a design file gives and that become a folder under a folder a command was given (a compare
design's arms and pools, `serve --name`, the FOLDER of `runs OUT --resume FOLDER`), and the paths built from them.

A name is one path component of safe characters, checked where it is parsed: '../victim', '/abs', '' or 'a/b'
would put a write or a delete outside the folder. A path built from checked names can still leave its folder
through a symbolic link inside it; `inside` refuses that before anything is written or deleted there.
"""
from __future__ import annotations

import re
from pathlib import Path

_SAFE = re.compile(r"[A-Za-z0-9._-]+")
SAFE_CHARACTERS = "letters, digits, '.', '_' and '-'"


def check_name(name, what: str) -> str:
    """`name` when it is one path component of SAFE_CHARACTERS other than '.' and '..'; else ValueError (one line)
    naming `what` (the option or the design key) and the value."""
    if not isinstance(name, str) or not _SAFE.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"{what} {name!r}: expected one folder name of {SAFE_CHARACTERS} (not '.' or '..')")
    return name


def inside(folder: str | Path, path: str | Path) -> Path:
    """`path` as given, once it resolves (symbolic links followed) to `folder` or below it; else ValueError (one line,
    saying where it leads) before anything is written or deleted there."""
    root, target = Path(folder).resolve(), Path(path).resolve()
    if target != root and root not in target.parents:
        raise ValueError(f"{path} leads outside {folder} (to {target}, through a symbolic link); nothing is written "
                         f"or deleted there")
    return Path(path)
