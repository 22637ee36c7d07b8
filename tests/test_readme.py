"""The documentation's "From Python" (docs/getting-started.md), "Use with TRL" and "Use with verl" (docs/training.md)
snippets, run as written (in a scratch folder); the other blocks of README.md and docs/ run in
tests/test_docs_blocks.py."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def blocks(section: str, page: str = "training.md") -> list[tuple[str, str]]:
    """(language, code) of each fenced block in the section `## {section}` of a docs page."""
    text = (DOCS / page).read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """A small `runs/demo` (the README's own command, with fewer prompts) in a scratch folder."""
    from tokencredit.flows.cli import main

    root = tmp_path_factory.mktemp("readme")
    assert main(["annotate", "--out", str(root / "runs/demo"), "--limit", "1", "--n", "4", "--max-new-tokens", "32",
                 "--runner", "none"]) == 0
    return root


def run_section(section: str, root: Path, monkeypatch) -> dict:
    from tokencredit.flows.cli import main

    monkeypatch.chdir(root)
    scope: dict = {}
    ran = 0
    for language, code in blocks(section):
        if language == "python":
            exec(compile(code, f"README {section}", "exec"), scope)
            ran += 1
        elif language == "bash":
            for line in code.splitlines():
                assert line.startswith("tokencredit "), line
                assert main(shlex.split(line)[1:]) == 0, line
                ran += 1
    assert ran >= 2
    return scope


def test_use_with_trl(demo_run, monkeypatch):
    pytest.importorskip("trl")
    scope = run_section("Use with TRL", demo_run, monkeypatch)
    assert scope["trainer"].state.global_step == 2


def test_use_with_verl(demo_run, monkeypatch, capsys):
    pytest.importorskip("verl")
    scope = run_section("Use with verl", demo_run, monkeypatch)
    assert 0 <= scope["scores"]["score"] <= 1
    assert capsys.readouterr().out.strip().endswith("compute_mrtpo_advantage")
    config_lines = [code for language, code in blocks("Use with verl") if language == ""][0]
    assert "algorithm.adv_estimator=mrtpo" in config_lines
    assert "reward.custom_reward_function.path=pkg://tokencredit.pipeline.integrations.verl" in config_lines


def test_the_datasets_example(demo_run, monkeypatch):
    """The dataset page's `hf` export and its `datasets` snippet."""
    from tokencredit.flows.cli import main

    command, code = re.search(r"<!-- tested-by: [^\n]*-->\n```bash\n(tokencredit export runs/demo --format hf[^\n]*)\n```\n\n"
                              r"<!-- tested-by: [^\n]*-->\n```python\n(.*?)```",
                              (DOCS / "dataset.md").read_text(), flags=re.S).groups()
    monkeypatch.chdir(demo_run)
    assert main(shlex.split(command)[1:]) == 0
    scope: dict = {}
    exec(compile(code, "README datasets", "exec"), scope)
    row = scope["row"]
    assert len(row["token_texts"]) == len(row["advantages"]) == len(row["token_ids"])
    assert len(row["reward_names"]) == len(row["rewards"]) > 0


def test_from_python(tmp_path, monkeypatch, capsys):
    """The "From Python" example as written, then the report anchor and the query line that the operations page
    gives for a response of its run."""
    from tokencredit.flows.cli import main
    from tokencredit.pipeline.dataset.report import write_report

    section = (DOCS / "getting-started.md").read_text().split("\n## From Python\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "README From Python", "exec"), scope)
    run = scope["run"]
    assert run.manifest["complete"] and run.manifest["totals"]["responses"] == len(scope["samples"]) == 3 * 4
    assert len(capsys.readouterr().out.splitlines()) == 4

    anchor, sql = re.search(r"`report\.html#([^`]+)`.*?`tokencredit query OUT \"([^\"]+)\"`",
                            (DOCS / "operations" / "index.md").read_text(), flags=re.S).groups()
    assert f'id="{anchor}"' in write_report(run.path).read_text()
    assert main(["query", str(run.path), sql]) == 0
    assert capsys.readouterr().out.count(f"│ {anchor} ") == 1


def test_the_readme_install_command_is_the_one_ci_runs():
    (install,) = re.findall(r"```bash\n(pip install [^\n]*)\n```", README.read_text())
    assert install in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("page", [README, DOCS / "getting-started.md"])
def test_the_test_command_names_skips_says_how_long_it_takes_and_offers_a_first_check(page):
    """The command CI runs (.ci/run runs the README's), then its length and a fast subset whose marker exists."""
    import tomllib

    text = page.read_text()
    (command,) = re.findall(r"<!-- not-runnable: the test command itself[^\n]*-->\n```bash\n(.*?)\n```", text, re.S)
    assert command == "python -m pytest -q -rs"
    after = text.split(f"{command}\n```\n", 1)[1].strip().split("\n\n", 1)[0]  # the paragraph after the block
    assert re.search(r"takes about \d+ minutes on a 2-core", after), after
    first = re.search(r'`(python -m pytest -q -rs -m "not slow" (tests/\S+\.py\s+)+)?tests/\S+\.py`', after.replace(
        "\n", " "))
    assert first, after
    for path in re.findall(r"tests/\S+?\.py", first.group(0)):
        assert (ROOT / path).is_file(), path
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert any(marker.startswith("slow:") for marker in markers)
