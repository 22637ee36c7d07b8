"""The documentation's figures: each rendered figure equals its bench/results row; a results table holds no number that
no row produced; the README's results table and every page rendered from a template are the renderer's, so that a page
read in the repository shows no placeholder; no issue numbers; the README stays short."""
from __future__ import annotations

import difflib
import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md"))


def load_figures():
    spec = importlib.util.spec_from_file_location("docs_figures", DOCS / "figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def figures():
    return load_figures()


def template_of(page: Path) -> Path | None:
    template = DOCS / "templates" / f"{page.relative_to(DOCS)}.j2"
    return template if template.is_file() else None


def render(figures, page: Path) -> tuple[str, list[dict]]:
    """The page as its template renders (the page as written where it has none), and the figures it rendered."""
    figures.RENDERED.clear()
    template = template_of(page)
    text = page.read_text() if template is None else figures.render_template(template)
    return text, list(figures.RENDERED)


def raw(file: str):
    return json.loads((ROOT / "bench" / "results" / file).read_text())


def lookup(file: str, key, where: dict):
    """The value independently of the renderer: the one row of `file` matching `where`, then `key`."""
    data = raw(file)
    if isinstance(data, list):
        matches = [r for r in data if all(r.get(k) == v for k, v in where.items())]
        assert len(matches) == 1, f"{file} {where}: {len(matches)} rows"
        data = matches[0]
    for part in key.split(".") if isinstance(key, str) else key:
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def parse(text: str):
    """A rendered figure back to numbers: '0.383', '+0.015', '1.56', '97%', '6,258', '[0.91, 1.44]', 'n/a'."""
    text = text.strip()
    if text == "n/a":
        return None, 0
    if text.startswith("["):
        parts = [parse(p) for p in text[1:-1].split(", ")]
        return [p[0] for p in parts], min(p[1] for p in parts)
    scale = 100 if text.endswith("%") else 1
    number = text.rstrip("%").replace(",", "")
    decimals = len(number.split(".")[1]) if "." in number else 0
    return float(number) / scale, decimals + (2 if scale == 100 else 0)


def agrees(text: str, value, fmt: str | None = None) -> bool:
    if fmt == "met":
        return isinstance(value, bool) and text == ("met" if value else "not met")
    if isinstance(value, (bool, str)):
        return text == str(value)
    parsed, decimals = parse(text)
    if value is None or parsed is None:
        return value is None and parsed is None
    if isinstance(value, list):
        return isinstance(parsed, list) and len(parsed) == len(value) and all(
            abs(p - v) <= 0.5 * 10 ** -decimals + 1e-9 for p, v in zip(parsed, value))
    return abs(parsed - value) <= 0.5 * 10 ** -decimals + 1e-9


def check(entry: dict) -> None:
    if "over" in entry:
        over = entry["over"]
        value = lookup(entry["file"], entry["key"], entry["where"]) / lookup(over["file"], over["key"], over["where"])
    elif "row" in entry:
        assert entry["row"] in raw(entry["file"]), f"{entry['file']}: a table row that is not in the file"
        value = entry["row"]
        for part in entry["key"].split(".") if isinstance(entry["key"], str) else entry["key"]:
            value = value[part]
    else:
        value = lookup(entry["file"], entry["key"], entry["where"])
    if entry.get("scale") is not None and value is not None:
        value = [v * entry["scale"] for v in value] if isinstance(value, list) else value * entry["scale"]
    assert agrees(entry["text"], value, entry.get("fmt")), \
        f"{entry['file']} {entry['key']} {entry['where']}: rendered {entry['text']!r}, the row holds {value!r}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_every_image_a_rendered_page_shows_exists(figures, page):
    """(mkdocs build --strict does not check images; a generated figure must be committed with its rows)"""
    for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", render(figures, page)[0]):
        assert (page.parent / target).is_file(), f"{page.name}: {target} is missing"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_every_rendered_figure_equals_its_row(figures, page):
    _, rendered = render(figures, page)
    for entry in rendered:
        check(entry)


NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?%?")


def tables(text: str) -> list[list[str]]:
    """The Markdown tables of a text (outside fenced code), each as its lines."""
    out, current, fenced = [], [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("|"):
            current.append(line)
        elif current:
            out.append(current)
            current = []
    return out + ([current] if current else [])


MEASURED_CELL = re.compile(r"[-+]?\d[\d,]*\.\d+[x%]?(?: \[[^\]]*\])?|[-+]?\d+%")
OPEN, CLOSE = "\u27e6", "\u27e7"  # marks around each rendered figure in the marked rendering


def loose_numbers(table: list[str]) -> list[str]:
    """The numbers in a table's body cells (the label column, code spans and link targets left out) that are not
    rendered figures (marked OPEN ... CLOSE), in a table that holds rendered figures. In a table without one, a
    cell that is nothing but a measured-looking number (0.65, 1.49x, 97%, +0.015 [-0.004, +0.035]) marks a
    hand-copied results table; prose cells (a version, a bound) are left alone."""
    has_figures = any(OPEN in line for line in table)
    found = []
    for line in table[2:]:
        for cell in line.strip().strip("|").split("|")[1:]:
            cell = re.sub(r"`[^`]*`|\]\([^)]*\)", "", cell)
            if has_figures:
                found += NUMBER.findall(re.sub(f"{OPEN}[^{CLOSE}]*{CLOSE}", " ", cell))
            elif MEASURED_CELL.fullmatch(cell.strip().strip("*").strip()):
                found.append(cell.strip().strip("*").strip())
    return found


def marked(figures, monkeypatch, page: Path | None) -> str:
    """The page (None: the README's results table) rendered with every figure between OPEN and CLOSE."""
    plain = figures.fmt_value
    monkeypatch.setattr(figures, "fmt_value", lambda value, fmt=None: f"{OPEN}{plain(value, fmt)}{CLOSE}")
    try:
        return figures.headline_table() if page is None else render(figures, page)[0]
    finally:
        monkeypatch.setattr(figures, "fmt_value", plain)


@pytest.mark.parametrize("page", PAGES + [ROOT / "README.md"], ids=lambda p: p.name if p.parent == ROOT else str(
    p.relative_to(DOCS)))
def test_results_tables_hold_only_numbers_that_rows_produced(figures, page, monkeypatch):
    if page.parent == ROOT:  # the README: its generated table, marked, and every other table as written
        text = page.read_text()
        start, end = text.index(figures.README_BEGIN), text.index(figures.README_END)
        text = text[:start] + marked(figures, monkeypatch, None) + "\n" + text[end:]
    else:
        text = marked(figures, monkeypatch, page)
    for table in tables(text):
        loose = loose_numbers(table)
        assert not loose, f"{page.name}: numbers in a results table that no row produced: {loose}\n" + \
                          "\n".join(table[:3])


def test_a_bad_placeholder_is_an_error_naming_the_file_and_the_selector(figures):
    with pytest.raises(figures.FigureError, match=r"localization_own\.json: 0 rows match credit='nope'"):
        figures.result("localization_own.json", "top_in_decisive", credit="nope")
    with pytest.raises(figures.FigureError, match=r"localization_own\.json: \d+ rows match credit='p2t'"):
        figures.result("localization_own.json", "top_in_decisive", credit="p2t")
    with pytest.raises(figures.FigureError, match="has no key 'nope'"):
        figures.result("speed.json", "nope")
    with pytest.raises(figures.FigureError, match="no such results file"):
        figures.result("nope.json", "x")


def test_a_changed_row_changes_the_rendered_figure(figures, tmp_path, monkeypatch):
    """The renderer reads the rows, not a copy: a changed value is rendered as the new value."""
    (tmp_path / "x.json").write_text(json.dumps([{"credit": "a", "v": 0.1234}, {"credit": "b", "v": 0.5}]))
    monkeypatch.setattr(figures, "RESULTS", tmp_path)
    figures.load.cache_clear()
    try:
        assert figures.result("x.json", "v", credit="a") == "0.123"
        assert figures.result_ci("x.json", "v", "v", "v", fmt="+.2f", credit="b") == "+0.50 [+0.50, +0.50]"
        (tmp_path / "x.json").write_text(json.dumps([{"credit": "a", "v": 0.9}]))
        figures.load.cache_clear()
        assert figures.result("x.json", "v", credit="a") == "0.900"
        assert "| a | 0.900 |" in figures.result_table("x.json", columns=[["credit", "credit"], ["v", "v"]])
    finally:
        figures.load.cache_clear()


def test_the_figures_check_catches_a_figure_that_differs_from_its_row(figures):
    entry = {"file": "speed.json", "key": "mrtpo_over_gdpo", "where": {}, "text": "1.49"}
    with pytest.raises(AssertionError, match="the row holds"):
        check(entry)
    assert agrees(figures.fmt_value(False, "met"), False, "met") and not agrees("met", False, "met")
    assert loose_numbers(["| a | b |", "|---|---|", "| x | **0.65** |", "| y | verl 0.9 caps it below 5.11 |"]) == \
        ["0.65"]
    assert loose_numbers(["| a | b |", "|---|---|", f"| x | {OPEN}0.383{CLOSE} [{OPEN}0.318{CLOSE}, "
                          f"{OPEN}0.448{CLOSE}] and 0.5 |"]) == ["0.5"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_a_page_read_in_the_repository_is_its_templates_rendering(figures, page):
    """A reader of docs/*.md on a code host sees figures, never a placeholder; a page with a template is current."""
    text = page.read_text()
    assert "{{" not in text and "{%" not in text, f"{page.name}: a placeholder in a committed page: move it into " \
                                                  f"docs/templates/{page.relative_to(DOCS)}.j2"
    template = template_of(page)
    if template is not None:
        rendered = figures.render_template(template)
        diff = "".join(difflib.unified_diff(text.splitlines(True), rendered.splitlines(True), "committed", "rendered",
                                            n=1))
        assert text == rendered, f"{page.relative_to(ROOT)} differs from {template.relative_to(ROOT)}'s rendering " \
                                 f"(edit the template, then python docs/figures.py --pages):\n{diff[:3000]}"


def test_every_template_renders_a_page_in_the_nav(figures):
    nav = (ROOT / "mkdocs.yml").read_text()
    for template, page in figures.templated_pages():
        assert f": {page.relative_to(DOCS)}\n" in nav, f"{template.name} renders {page}, which the site does not show"


def test_the_readme_results_table_is_the_renderers(figures):
    text = (ROOT / "README.md").read_text()
    assert figures.readme_with_table(text) == text, "README.md's results table is stale: python docs/figures.py --readme"


def test_readme_is_short_and_no_page_names_an_issue_number():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
    for path in [ROOT / "README.md", *PAGES]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not re.search(r"issue [0-9]", line, flags=re.I), f"{path.name}:{number}: {line}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_every_page_starts_with_what_the_reader_can_do(page):
    lines = [line for line in page.read_text().splitlines() if line.strip() and not line.startswith("<!-- generated")]
    assert lines[0].startswith("# "), f"{page.name}: starts with its title"
    assert lines[1].startswith("After reading this page you"), f"{page.name}: the sentence after the title says " \
                                                               "what the reader can do after reading it"


def test_the_cli_reference_and_the_schema_tables_come_from_the_code(figures):
    from tokencredit import schemas
    from tokencredit.flows.cli import build_parser

    reference = figures.cli_reference()
    for action in build_parser()._subparsers._group_actions[0].choices:
        assert f"## `tokencredit {action}`" in reference
    table = figures.schema_table("CREDITS")
    assert table.count("\n") == len(schemas.CREDITS) + 1
    assert "| `constraint_index` | `int32` | yes | which constraint of an instruction record; NULL elsewhere |" in table


def test_the_powered_section_renders_its_rows_once_they_exist(figures, tmp_path, monkeypatch):
    """compare.md's powered design waits on its run: without its rows a line says so; with them (stand-in rows here,
    until the run's are in) each primary difference is written with its interval, its verdict and what it could
    detect."""
    page = DOCS / "experiments" / "compare.md"
    powered = "cdc5becceba3d240ddfce2257846994be3561ea84cb9ca6d9f07fa86699f5b37"
    rows = [r for r in raw("compare.json") if r["design_hash"] != powered]
    for name in (p.name for p in (ROOT / "bench" / "results").glob("*.json")):
        (tmp_path / name).write_text((ROOT / "bench" / "results" / name).read_text())
    pairs = [("mc", "gdpo_tree", 0.021, 0.004), ("mrtpo", "gdpo", 0.002, -0.009), ("mc", "gdpo", -0.02, -0.031),
             ("mc", "rs", 0.0, -0.01), ("gdpo_tree", "gdpo", 0.0, -0.01)]
    stand_in = [{**rows[0], "method": m, "baseline": b, "diff": d, "ci_low": low, "ci_high": low + 0.02, "mde": 0.012,
                 "seeds": [100, 101, 102, 103], "design_hash": powered} for m, b, d, low in pairs]
    monkeypatch.setattr(figures, "RESULTS", tmp_path)
    texts, readme = [], []
    for content in (rows, rows + stand_in):
        (tmp_path / "compare.json").write_text(json.dumps(content))
        figures.load.cache_clear()
        try:
            texts.append(render(figures, page)[0])
            readme.append(figures.headline_table())
        finally:
            figures.load.cache_clear()
    waiting, text = texts
    assert "has not scored every seed yet" in waiting and "(primary)" not in waiting
    assert "powered" not in readme[0]
    assert readme[1].splitlines()[2].startswith(  # the README's table leads with the powered design's differences
        "| Training, powered: Monte-Carlo credit minus GDPO on the same tree pool, held-out reward (4 seeds x 256 "
        "prompts x 1 decode; detected above 0) | +0.021 [+0.004, +0.024]; detectable 0.012 |")
    assert "has not scored every seed yet" not in text and "](compare_powered.png)" in text
    assert "`mc - gdpo_tree` (primary): +0.021 [+0.004, +0.024],\n  detected above 0; detectable\n  0.012" in text
    assert "`mrtpo - gdpo` (primary): +0.002 [-0.009, +0.011],\n  not detected;" in text
    assert "`mc - gdpo` (primary): -0.020 [-0.031, -0.011],\n  detected below 0;" in text
    assert "| mc | rs | +0.000 [-0.010, +0.010] |" in text
