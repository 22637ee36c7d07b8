"""One namespace: tokencredit's folders install as `tokencredit.pipeline`, `tokencredit.verifiers`,
`tokencredit.schemas` and `tokencredit.flows`, so that other packages with those generic top-level names
(PyPI's `verifiers`, an RL environments library, above all) can sit first on the path and break nothing."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FOREIGN = ("verifiers", "pipeline", "schemas", "flows")


@pytest.fixture
def foreign_path(tmp_path) -> dict[str, str]:
    """An environment whose PYTHONPATH puts a foreign package of each generic name first; importing one fails."""
    site = tmp_path / "foreign"
    for name in FOREIGN:
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text(f"raise ImportError('the foreign {name!r} package was imported')\n")
    return {**os.environ, "PYTHONPATH": str(site)}


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "foreign" not in done.stderr, done.stderr[-3000:]
    return done


def test_the_foreign_packages_shadow_their_names(foreign_path, tmp_path):
    done = subprocess.run([sys.executable, "-c", "import verifiers"], env=foreign_path, cwd=tmp_path,
                          capture_output=True, text=True)
    assert "the foreign 'verifiers' package was imported" in done.stderr


@pytest.mark.slow
def test_annotate_train_and_trl_rewards_work_beside_foreign_packages(foreign_path, tmp_path):
    cli = shutil.which("tokencredit")
    assert cli, "the console script is installed with the package"
    run([cli, "annotate", "--out", "run", "--limit", "1", "--n", "2", "--max-new-tokens", "8", "--tasks", "tools",
         "--runner", "none"], foreign_path, tmp_path)
    run([cli, "train", "--data", "run", "--out", "trained", "--steps", "1", "--batch-size", "2"], foreign_path, tmp_path)
    assert (tmp_path / "trained").is_dir()
    code = ("from tokencredit import verifiers; from tokencredit.pipeline.integrations.trl import verifier_rewards\n"
            "records = [r for r in verifiers.load_tasks('demo')[0] if r.task == 'tools'][:1]\n"
            "scores = [f(prompts=['p'], completions=[records[0].reference_response], record_id=[records[0].id])\n"
            "          for f in verifier_rewards(records)]\n"
            "print(scores)")
    done = run([sys.executable, "-c", code], foreign_path, tmp_path)
    assert "[1.0]" in done.stdout, done.stdout
