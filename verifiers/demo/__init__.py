"""The bundled demo prompt sets and the scripts that build them (`python -m tokencredit.verifiers.demo.build_sql`, ...)."""
from __future__ import annotations

import json
from pathlib import Path


def write_jsonl(records: list[dict], path: Path) -> None:
    """One JSON object per line, UTF-8, `\\n` line ends: byte-identical on every platform."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
