"""bench/common.update_figures: benchmarks that share bench/results/speed.json keep each other's keys.

Run in child processes: importing bench/common sets torch's thread count for the whole process."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def update_in_child(path: Path, updates: list[dict]) -> subprocess.Popen:
    """A process that applies `updates` in turn."""
    code = (f"import sys, pathlib; sys.path.insert(0, {str(ROOT / 'bench')!r}); from common import update_figures\n"
            f"for values in {updates!r}: update_figures(values, path=pathlib.Path({str(path)!r}))")
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)


def test_updates_keep_other_keys_also_when_two_benchmarks_write_at_once(tmp_path):
    path = tmp_path / "results" / "speed.json"
    first = [{"model": "a", "sampling_over_generate": 0.7}, {"model": "b", "mrtpo_over_gdpo": 1.2}]
    assert update_in_child(path, first).wait() == 0
    assert json.loads(path.read_text()) == {"model": "b", "sampling_over_generate": 0.7, "mrtpo_over_gdpo": 1.2}
    writers = [update_in_child(path, [{f"key_{w}": i} for i in range(40)]) for w in range(2)]
    assert [w.wait() for w in writers] == [0, 0]
    assert json.loads(path.read_text()) == {"model": "b", "sampling_over_generate": 0.7, "mrtpo_over_gdpo": 1.2,
                                            "key_0": 39, "key_1": 39}
