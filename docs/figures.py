"""The documentation's generated content: figures and tables from bench/results rows, the CLI reference from
argparse, the dataset's schema tables from schemas/.

A page with generated content is written as a Jinja template, docs/templates/PAGE.md.j2, and rendered into the
committed docs/PAGE.md by `python docs/figures.py --pages`, so that the page read in the repository shows its
figures as the site does (tests/test_docs.py fails when a committed page differs from its rendering). Templates call
this module's macros:

    {{ result("speed.json", "mrtpo_over_gdpo", fmt=".2f") }}                 a key of a JSON object file
    {{ result("localization_own.json", "top_in_decisive", credit="p2t", pool="flat", kind="all") }}
    {{ result_ci("closed_loop.json", "diff", "ci_low_seeds", "ci_high_seeds", fmt="+.3f", method="mc", baseline="gdpo") }}
    {{ result_table("reward_model.json", columns=[["family", "family"], ["accuracy", "pairwise_accuracy"]], where={...}) }}

A file that holds a list of rows needs keyword arguments that select exactly one row (none or several is an error
naming the file and the selector); a key may be a dotted path into nested objects (`branch_stats.sentence`).
Formatting: `fmt` is a Python format spec; without it a float is written with 3 decimals and an int as it is.
Every call is recorded in RENDERED (file, key, selector, text) so that tests/test_docs.py can check each rendered
figure against its row. `python docs/figures.py --readme` rewrites README.md's generated results table.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs"
TEMPLATES = DOCS / "templates"  # docs/templates/X.md.j2 is rendered into docs/X.md
RENDERED: list[dict] = []


class FigureError(ValueError):
    """A placeholder that names no value: a missing file, key or row, or a selector matching several rows."""


@lru_cache(maxsize=None)
def load(file: str):
    path = RESULTS / file
    if not path.is_file():
        raise FigureError(f"{file}: no such results file in bench/results")
    return json.loads(path.read_text())


def selector_text(where: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in where.items()) or "no selector"


def rows_of(file: str, where: dict) -> list[dict]:
    """The rows of a list file that match every `where` item."""
    data = load(file)
    if not isinstance(data, list):
        raise FigureError(f"{file}: holds one object, not rows; select no row ({selector_text(where)})")
    for key in where:
        if not any(key in row for row in data):
            raise FigureError(f"{file}: no row has the column {key!r} ({selector_text(where)})")
    return [row for row in data if all(row.get(k) == v for k, v in where.items())]


def row_of(file: str, where: dict) -> dict:
    """The one object (a dict file) or the one row (a list file) that `where` selects."""
    data = load(file)
    if isinstance(data, dict):
        if where:
            raise FigureError(f"{file}: holds one object, not rows; remove the selector ({selector_text(where)})")
        return data
    matches = rows_of(file, where)
    if len(matches) != 1:
        raise FigureError(f"{file}: {len(matches)} rows match {selector_text(where)}; a figure needs exactly one")
    return matches[0]


def value_of(file: str, row: dict, key, where: dict):
    """`key` of the row: a name, a dotted path into nested objects, or a list of names (for names with dots)."""
    value = row
    for part in (key.split(".") if isinstance(key, str) else key):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise FigureError(f"{file}: the row selected by {selector_text(where)} has no key {key!r}")
    return value


def fmt_value(value, fmt: str | None = None) -> str:
    """A figure as the docs write it: `fmt` (a format spec; "met": a target's bool as "met" or "not met"), else a
    float with 3 decimals, an int as it is."""
    if value is None:
        return "n/a"
    if isinstance(value, list):
        return "[" + ", ".join(fmt_value(v, fmt) for v in value) + "]"
    if fmt == "met":
        return "met" if value else "not met"
    if fmt is not None:
        return format(value, fmt)
    if isinstance(value, bool) or isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return str(value)
    return format(value, ".3f")


def result(file: str, key, fmt: str | None = None, scale: float | None = None, **where) -> str:
    """One figure: `key` of the object in `file`, or of the one row that `where` selects; `scale` multiplies it
    (1000: per 1,000 tokens)."""
    value = value_of(file, row_of(file, where), key, where)
    if scale is not None and value is not None:
        value = value * scale
    text = fmt_value(value, fmt)
    RENDERED.append({"file": file, "key": key, "where": where, "fmt": fmt, "scale": scale, "text": text})
    return text


def result_ratio(file: str, key, over_file: str, over_key, fmt: str = ".2f", where: dict | None = None,
                 over_where: dict | None = None) -> str:
    """A figure divided by another (each a key of a selected row): a ratio or a per-unit figure."""
    where, over_where = where or {}, over_where or {}
    top = value_of(file, row_of(file, where), key, where)
    bottom = value_of(over_file, row_of(over_file, over_where), over_key, over_where)
    text = fmt_value(top / bottom, fmt)
    RENDERED.append({"file": file, "key": key, "where": where, "fmt": fmt, "text": text,
                     "over": {"file": over_file, "key": over_key, "where": over_where}})
    return text


def result_ci(file: str, key, low="ci_low", high="ci_high", fmt: str | None = None, scale: float | None = None,
              **where) -> str:
    """`value [low, high]` of one row: a figure with its interval."""
    return (f"{result(file, key, fmt, scale, **where)} [{result(file, low, fmt, scale, **where)}, "
            f"{result(file, high, fmt, scale, **where)}]")


def has_rows(file: str, **where) -> bool:
    """Whether a row of `file` matches `where`: a section that waits on a run's rows is written without them."""
    return bool(rows_of(file, where))


def result_verdict(file: str, **where) -> str:
    """A difference row's verdict from its 95% interval: 'detected above 0', 'detected below 0' or 'not detected'
    (its figures are rendered beside it with `result_ci` and `result`)."""
    from tokencredit.pipeline.compare.report import detected

    return detected(row_of(file, where))


def cell(file: str, row: dict, column, where: dict) -> str:
    """A table cell: column is [header, key], [header, key, fmt] or [header, key, fmt, scale]; a key
    `ci:diff,ci_low,ci_high` writes a value with its interval."""
    key, fmt = column[1], column[2] if len(column) > 2 else None
    scale = column[3] if len(column) > 3 else None
    selector = {**where, **{k: row[k] for k in row if k in IDENTITY and k not in where}}
    if key.startswith("ci:"):
        value, low, high = key[3:].split(",")
        return f"{_table_value(file, row, value, fmt, selector, scale)} " \
               f"[{_table_value(file, row, low, fmt, selector, scale)}, {_table_value(file, row, high, fmt, selector, scale)}]"
    return _table_value(file, row, key, fmt, selector, scale)


# Row fields that name a row rather than measure it: recorded as the selector of a table cell
IDENTITY = ("model", "arm", "method", "baseline", "decoding", "credit", "locate", "kind", "pool", "split",
            "relevance", "ablation", "style", "family", "cut", "reward_family", "sample", "temperature", "base",
            "pooling", "train_layers", "layer", "fraction", "run", "floor", "layout", "query")


def _table_value(file: str, row: dict, key: str, fmt: str | None, where: dict, scale: float | None = None) -> str:
    value = value_of(file, row, key, where)
    if scale is not None and value is not None:
        value = value * scale
    text = fmt_value(value, fmt)
    RENDERED.append({"file": file, "key": key, "where": where, "fmt": fmt, "scale": scale, "text": text, "row": row})
    return text


def result_table(file: str, columns: list, where: dict | None = None, order: list | None = None,
                 link: str | None = None) -> str:
    """A Markdown table of the rows of `file` that match `where`, one column per [header, key(, fmt)]; `order`
    lists values of the first column's key to give the rows in that order (rows not listed are left out)."""
    where = where or {}
    rows = rows_of(file, where) if isinstance(load(file), list) else [load(file)]
    if not rows:
        raise FigureError(f"{file}: no row matches {selector_text(where)}")
    if order is not None:
        first = columns[0][1]
        rows = [r for value in order for r in rows if r.get(first) == value]
        if len(rows) != len(order):
            raise FigureError(f"{file}: order {order!r} does not select one row each among {selector_text(where)}")
    lines = ["| " + " | ".join(c[0] for c in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(cell(file, row, c, where) for c in columns) + " |")
    source = f"`bench/results/{file}`" if link is None else link
    return "\n".join(lines) + f"\n\nRows: {source}."


# The README's headline results: one row per finding, each figure from its row (see `headline_table`)
# the Monte-Carlo credit experiment's design (bench/compare_designs/mc_tree.toml), re-analysed by compare
MC_DESIGN = "59894c4cd8697f4984c94381c94c203180a553a74d19121d37e160c88b5ed6f0"
HEADLINES = [
    ("MRTPO's replay puts a blamed reward's top relevance on a hand-made edit (top-1, test split)",
     "localization.json", "top1", dict(model="smollm2-135m-instruct", split="test", relevance="logprob_signed",
                                       ablation="drop", style="auto", locate="replay"), "experiments/localization.md"),
    ("`--locate both`: verifier spans where they exist, the replay elsewhere (top-1, same cases)",
     "localization.json", "top1", dict(model="smollm2-135m-instruct", split="test", relevance="logprob_signed",
                                       ablation="drop", style="auto", locate="both"), "experiments/localization.md"),
    ("Own samples: P2T's top token in the value curve's decisive segment (first-token rule: next row)",
     "localization_own.json", "top_in_decisive", dict(credit="p2t", kind="all", pool="flat"),
     "experiments/localization.md"),
    ("Own samples: the first-token rule on the same pairs",
     "localization_own.json", "top_in_decisive", dict(credit="first_token", kind="all", pool="flat"),
     "experiments/localization.md"),
    ("Training, offline: MRTPO minus GDPO, held-out reward",
     "compare.json", "diff", dict(method="mrtpo", baseline="gdpo", design_hash=MC_DESIGN),
     "experiments/compare.md"),
    ("Training, offline: Monte-Carlo credit on tree groups minus GDPO",
     "compare.json", "diff", dict(method="mc", baseline="gdpo", design_hash=MC_DESIGN), "experiments/compare.md"),
    ("Reward model head on frozen SmolLM2: held-out pairwise accuracy",
     "reward_model.json", "pairwise_accuracy", dict(family="mean", train_layers=0, pooling="response_mean"),
     "experiments/reward-model.md"),
    ("Annotation time, MRTPO over GDPO alone (SmolLM2, 256 new tokens)", "speed.json", "mrtpo_over_gdpo", {},
     "benchmarks.md"),
]
# the powered design (bench/compare_designs/powered.toml, as registered): its rows join once its run has scored
# every seed, and the README's table leads with its primary differences from then on
POWERED_DESIGN = "cdc5becceba3d240ddfce2257846994be3561ea84cb9ca6d9f07fa86699f5b37"
POWERED_HEADLINES = [
    ("Training, powered: Monte-Carlo credit minus GDPO on the same tree pool, held-out reward", "compare.json", "diff",
     dict(method="mc", baseline="gdpo_tree", design_hash=POWERED_DESIGN), "experiments/compare.md"),
    ("Training, powered: MRTPO minus GDPO, held-out reward", "compare.json", "diff",
     dict(method="mrtpo", baseline="gdpo", design_hash=POWERED_DESIGN), "experiments/compare.md"),
    ("Training, powered: Monte-Carlo credit on tree groups minus GDPO, held-out reward", "compare.json", "diff",
     dict(method="mc", baseline="gdpo", design_hash=POWERED_DESIGN), "experiments/compare.md"),
]
CI_KEYS = {"localization_own.json": ("ci_low", "ci_high"), "compare.json": ("ci_low", "ci_high"),
           "reward_model.json": ("ci_low", "ci_high")}


def headline_table(docs_url: str = "docs/") -> str:
    """The README's results table: each finding, its figure (with the 95% interval where the row has one), its
    results file and the page that explains it."""
    lines = ["| finding | figure [95% interval] | row | details |", "|---|---|---|---|"]
    powered = POWERED_HEADLINES if has_rows("compare.json", design_hash=POWERED_DESIGN) else []
    for text, file, key, where, page in powered + HEADLINES:
        fmt = "+.3f" if key == "diff" else ".2f" if key == "mrtpo_over_gdpo" else ".3f"
        if file in CI_KEYS:
            figure = result_ci(file, key, *CI_KEYS[file], fmt=fmt, **where)
            if file == "compare.json":  # a difference is read beside its verdict and what the design could detect
                row = row_of(file, where)
                text += (f" ({len(row['seeds'])} seeds x {row['prompts']:,} prompts x {len(row['decodes'])} "
                         f"decode{'s' * (len(row['decodes']) > 1)}; {result_verdict(file, **where)})")
                figure += f"; detectable {result(file, 'mde', fmt='.3f', **where)}"
        else:
            figure = result(file, key, fmt=fmt, **where) + ("x" if key.endswith("_over_gdpo") else "")
        lines.append(f"| {text} | {figure} | [`{file}`](bench/results/{file}) | [{page}]({docs_url}{page}) |")
    return "\n".join(lines)


README_BEGIN, README_END = "<!-- results:begin (generated by python docs/figures.py --readme) -->", \
    "<!-- results:end -->"


def readme_with_table(text: str) -> str:
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    return f"{head}{README_BEGIN}\n{headline_table()}\n{README_END}{tail}"


# ---- the CLI reference, from flows/cli.py's parser


def cli_reference() -> str:
    """Every command's --help, from `build_parser()`: a section per command (and per sub-command)."""
    from tokencredit.flows.cli import build_parser

    parser = build_parser()
    out = ["```text", _help(parser, "tokencredit"), "```"]
    for name, sub in _subcommands(parser):
        out += ["", f"## `tokencredit {name}`", "", "```text", _help(sub, f"tokencredit {name}"), "```"]
        for inner_name, inner in _subcommands(sub):
            out += ["", f"### `tokencredit {name} {inner_name}`", "", "```text",
                    _help(inner, f"tokencredit {name} {inner_name}"), "```"]
    return "\n".join(out)


def _subcommands(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def _help(parser: argparse.ArgumentParser, prog: str) -> str:
    import os

    os.environ.setdefault("COLUMNS", "110")
    parser.prog = prog
    return parser.format_help().rstrip()


# ---- the dataset's schema tables, from schemas/__init__.py


def schema_table(name: str) -> str:
    """A table of the Arrow schema `name` (RESPONSES, CREDITS, NODES, VALUES, DECISIVE): column, Arrow type,
    nullable, and the comment that schemas/__init__.py gives it."""
    from tokencredit import schemas

    schema = getattr(schemas, name)
    notes = field_comments(name)
    lines = ["| column | type | null | what it is |", "|---|---|---|---|"]
    for field in schema:
        note = notes.get(field.name, "").replace("|", "\\|")
        lines.append(f"| `{field.name}` | `{field.type}` | {'yes' if field.nullable else 'no'} | {note} |")
    return "\n".join(lines)


def field_comments(name: str) -> dict[str, str]:
    """Each field's comment in schemas/__init__.py's definition of `name`: the comment at the end of its line, or
    the comment lines just above it."""
    source = (ROOT / "schemas" / "__init__.py").read_text()
    block = source.split(f"\n{name} = pa.schema(", 1)[1].split("\n)\n", 1)[0]
    notes, above = {}, []
    for line in block.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# "))
            continue
        match = re.search(r'pa\.field\("(\w+)"', stripped)
        if match:
            trailing = stripped.split("#", 1)[1].strip() if "#" in stripped else ""
            notes[match.group(1)] = " ".join(above + ([trailing] if trailing else []))
        above = []
    return notes


# ---- a command's output, from the code and the shipped rows


def plan_output(design: str, *options: str) -> str:
    """What `tokencredit compare DESIGN --out runs/plan --plan OPTIONS` prints (a plan writes nothing); `design` is
    relative to the repository."""
    from tokencredit.flows.cli import build_parser
    from tokencredit.pipeline.compare.design import load_design
    from tokencredit.pipeline.compare.plan import cli_plan

    args = build_parser().parse_args(["compare", design, "--out", "runs/plan", "--plan", *options])
    return "\n".join(cli_plan(load_design(ROOT / design), args))


MACROS = (result, result_ci, result_ratio, result_table, result_verdict, has_rows, cli_reference, schema_table,
          plan_output)


# ---- the pages rendered from docs/templates/


def templated_pages() -> list[tuple[Path, Path]]:
    """(template, page) of every page that is rendered from a template."""
    return [(t, DOCS / t.relative_to(TEMPLATES).with_suffix("")) for t in sorted(TEMPLATES.rglob("*.md.j2"))]


def generated_notice(template: Path) -> str:
    return (f"<!-- generated from docs/{template.relative_to(DOCS)} by python docs/figures.py --pages: "
            "edit the template, not this page -->")


def render_template(template: Path) -> str:
    """The page that `template` renders to: its macros called (each figure recorded in RENDERED), a notice first."""
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    for fn in MACROS:
        env.globals[fn.__name__] = fn
    return generated_notice(template) + "\n" + env.from_string(template.read_text()).render()


def main() -> None:
    parser = argparse.ArgumentParser(description="rewrite the generated documentation from bench/results, the CLI "
                                                 "and the schemas")
    parser.add_argument("--readme", action="store_true", help="rewrite the table between the README's markers")
    parser.add_argument("--pages", action="store_true", help="render every docs/templates/X.md.j2 into docs/X.md")
    args = parser.parse_args()
    if args.readme:
        readme = ROOT / "README.md"
        readme.write_text(readme_with_table(readme.read_text()))
    if args.pages:
        for template, page in templated_pages():
            page.write_text(render_template(template))
    if not (args.readme or args.pages):
        print(headline_table())


if __name__ == "__main__":
    sys.exit(main())
