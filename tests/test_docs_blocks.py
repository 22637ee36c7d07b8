"""Every shell and Python block of README.md and docs/ runs here, or says why not: the line before it is
`<!-- not-runnable: REASON -->` (a GPU, a cluster, the install command) or `<!-- tested-by: tests/FILE::TEST -->`
(a test that runs it with its own checks).

Each page's blocks run in order in a scratch folder of their own, holding a copy of the demo run (`runs/demo`,
made once with the README's `tokencredit annotate --out runs/demo`). `tokencredit` lines run in this process
(with `--runner none` added where a command takes `--runner` and the block gives none: every runner writes the same
bytes, and Prefect's temporary server would add half a minute per command); other shell lines run in bash; the
Python blocks of a page share one namespace."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL, PYTHON = {"bash", "sh", "shell", "console"}, {"python", "py"}
RUNNER_COMMANDS = {"annotate", "repair", "values"}


def code_blocks(path: Path) -> list[tuple[str, str, str | None]]:
    """(language, code, marker) of each fenced block; marker is the HTML comment on the line before it, if any."""
    out, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        match = re.match(r"^```(\w*)\s*$", lines[i])
        if not match:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = before.strip() if before.strip().startswith("<!--") else None
        out.append((match.group(1), "\n".join(lines[i + 1:end]) + "\n", marker))
        i = end + 1
    return out


def runnable(path: Path) -> list[tuple[str, str]]:
    """The blocks of a page that this module runs; fails on a marker that does not say why or names no test."""
    out = []
    for language, code, marker in code_blocks(path):
        if language not in SHELL | PYTHON:
            continue
        if marker and marker.startswith("<!-- not-runnable:"):
            assert marker[len("<!-- not-runnable:"):-3].strip(), f"{path.name}: a not-runnable block gives no reason"
            continue
        if marker and marker.startswith("<!-- tested-by:"):
            target = marker[len("<!-- tested-by:"):-3].strip()
            file, _, test = target.partition("::")
            assert re.search(rf"^def {re.escape(test)}\(", (ROOT / file).read_text(), flags=re.M), \
                f"{path.name}: tested-by names no test: {target}"
            continue
        out.append((language, code))
    return out


def commands(code: str) -> list[tuple[str, str]]:
    """A shell block as ("tokencredit", line) and ("bash", chunk) steps: a tokencredit command may span lines inside
    quotes; heredocs and other lines go to bash together."""
    steps, chunk, pending, heredoc = [], [], "", None
    for line in code.splitlines():
        if heredoc is not None:
            chunk.append(line)
            heredoc = None if line.strip() == heredoc else heredoc
            continue
        if pending or line.startswith("tokencredit "):
            pending = f"{pending}\n{line}" if pending else line
            try:
                shlex.split(pending, comments=True)
            except ValueError:  # a quote still open: the command goes on on the next line
                continue
            if chunk:
                steps.append(("bash", "\n".join(chunk)))
                chunk = []
            steps.append(("tokencredit", pending))
            pending = ""
            continue
        match = re.search(r"<<'?(\w+)'?", line)
        heredoc = match.group(1) if match else None
        chunk.append(line)
    assert not pending, f"unclosed quote in: {pending}"
    if chunk:
        steps.append(("bash", "\n".join(chunk)))
    return steps


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    from tokencredit.flows.cli import main

    root = tmp_path_factory.mktemp("docs-demo")
    assert main(["annotate", "--out", str(root / "runs" / "demo"), "--runner", "none"]) == 0
    return root / "runs" / "demo"


def run_page(path: Path, scratch: Path, monkeypatch) -> int:
    from tokencredit.flows.cli import main

    monkeypatch.chdir(scratch)
    scope: dict = {"__name__": "__docs__"}
    ran = 0
    for language, code in runnable(path):
        if language in PYTHON:
            exec(compile(code, f"{path.name} block", "exec"), scope)
            ran += 1
            continue
        for kind, step in commands(code):
            if kind == "bash":
                done = subprocess.run(["bash", "-euo", "pipefail", "-c", step], cwd=scratch, capture_output=True,
                                      text=True)
                assert done.returncode == 0, f"{path.name}: {step}\n{done.stderr}"
            else:
                argv = shlex.split(step, comments=True)[1:]
                if argv[0] in RUNNER_COMMANDS and "--runner" not in argv:
                    argv += ["--runner", "none"]
                assert main(argv) == 0, f"{path.name}: {step}"
            ran += 1
    return ran


def test_every_block_runs_or_says_why_not():
    """The markers themselves: each page's blocks are listed, and every marker is well formed."""
    for path in PAGES:
        runnable(path)


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if runnable(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_blocks_of_a_page_run(page, demo_run, tmp_path, monkeypatch):
    shutil.copytree(demo_run, tmp_path / "runs" / "demo")
    assert run_page(page, tmp_path, monkeypatch) >= 1


def test_commands_split_multiline_queries_and_heredocs():
    code = 'cat > a.py <<\'PY\'\ntokencredit not a command\nPY\ntokencredit query runs/x "\nselect 1"\necho ok\n'
    assert commands(code) == [("bash", "cat > a.py <<'PY'\ntokencredit not a command\nPY"),
                              ("tokencredit", 'tokencredit query runs/x "\nselect 1"'), ("bash", "echo ok")]
