"""The HTML credit report: content, escaping, self-containment, and a headless Chromium render."""
import html
import re
import shutil
import subprocess

import pyarrow as pa
import pytest

from tokencredit.pipeline.dataset import analysis
from tokencredit.flows.cli import main
from tokencredit.pipeline.dataset.query import connect
from tokencredit.pipeline.dataset.report import shade, token_texts, write_report
from tokencredit.pipeline.dataset.writer import RunWriter
from tests.test_analysis import _tables

CHROMIUM = shutil.which("chromium")  # Debian package `chromium`


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return analysis.synthetic_run(tmp_path_factory.mktemp("report") / "run", responses=36, tokens=10, rewards=3,
                                  seed=5, p2t=True)


@pytest.fixture(scope="module")
def report(run):
    path = write_report(run)
    return path, path.read_text()


def test_report_shows_every_task_and_reward(run, report):
    path, text = report
    assert path == run.resolve() / "report.html"
    con = connect(run)
    names = analysis.rows(con, "SELECT DISTINCT task, unnest(reward_names) AS reward FROM responses")
    for row in names:
        assert f'id="task-{row["task"]}"' in text
        assert html.escape(row["reward"]) in text
    for kind in ("keyword_include", "length_words", "executable"):
        assert f">{kind}</td>" in text  # the reward tables group instruction constraints by kind
    for ids in analysis.chosen_responses(con, 2).values():
        for rid in ids:
            assert text.count(f'<div class="card" id="{rid}"><h3><a href="#{rid}">{rid}</a> ') == 1
    assert "replays done / skipped" in text and "P2T near-flat rate" in text and "P2T token advantage" in text


def test_token_text_is_escaped(report):
    _, text = report
    assert "&lt;sql&gt;" in text and "&lt;/sql&gt;" in text and "&lt;b&gt;" in text
    assert "<sql>" not in text and "</sql>" not in text
    assert ' &amp;' in text and "&quot;x&quot;" in text


def test_report_is_self_contained(report):
    _, text = report
    assert not re.search(r"https?://|<link|<img|<iframe|\bsrc=|@import|url\(", text)


def test_report_without_mrtpo_or_p2t(tmp_path):
    out = analysis.synthetic_run(tmp_path / "run", responses=12, tokens=6, rewards=2, mrtpo=False, p2t=False)
    dest = tmp_path / "elsewhere.html"
    text = write_report(out, dest, responses_per_task=1).read_text()
    assert "MRTPO was not computed in this run" in text and "No replay distances for this task" in text
    assert "MRTPO was not computed for this response" in text
    assert "P2T" not in text and not (out / "report.html").exists()


def test_shade_colour_and_intensity():
    assert shade(0.5, 1.0) == "background:rgba(22,163,74,0.425)"
    assert shade(-2.0, 1.0) == "background:rgba(220,38,38,0.850)"  # clipped at the scale
    assert shade(0.0, 0.0).endswith(",0.000)")


def test_token_texts_follow_character_spans():
    credits = [{"char_start": 0, "char_end": 5, "token_text": "Ġignored"},
               {"char_start": 5, "char_end": 6, "token_text": "Ċ"},
               {"char_start": 6, "char_end": 6, "token_text": ""}]
    assert token_texts("<sql>\n", credits) == ["<sql>", "↵\n", "∅"]


def _chromium(url: str, profile, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *extra, url],
        capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (Debian: apt-get install chromium)")
def test_report_renders_in_headless_chromium(report, tmp_path):
    from matplotlib.image import imread

    url = report[0].resolve().as_uri()
    dom = _chromium(url, tmp_path / "profile-dom", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert re.search(r'<body[^>]*data-ok="1"', dom.stdout), "the inline script did not run to its end"
    assert "Uncaught" not in dom.stderr, dom.stderr[-2000:]

    shot = tmp_path / "shot.png"
    result = _chromium(url, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1280,2000")
    assert result.returncode == 0 and shot.stat().st_size > 20_000, result.stderr[-2000:]
    rgb = imread(shot)[..., :3]
    assert rgb.shape[:2] == (2000, 1280) and rgb.std() > 0.05
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    green = (g - r > 0.15) & (g > b)  # the charts' bars are blue
    red = (r - g > 0.15) & (r - b > 0.15)
    assert green.sum() > 200 and red.sum() > 200  # token shading rendered


# --- choosing responses, context beside the tokens, legend, floor (issue 13) -------------------


def cards(text: str) -> list[str]:
    return re.findall(r'<div class="card" id="([^"]+)"><h3>', text)


def test_responses_per_task_and_ids_choose_the_cards(run, tmp_path, capsys):
    con = connect(run)
    text = write_report(run, tmp_path / "four.html", responses_per_task=4).read_text()
    chosen = analysis.chosen_responses(con, 4)
    assert sorted(cards(text)) == sorted(rid for ids in chosen.values() for rid in ids)
    assert all(len(ids) == 4 for ids in chosen.values())
    picked = ["r00000003", "r00000005", "r00000030"]
    text = write_report(run, tmp_path / "ids.html", ids=picked).read_text()
    assert sorted(cards(text)) == picked
    assert main(["report", str(run), "--dest", str(tmp_path / "x.html"), "--ids", "r00000003,nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "['nope'] are not in the run" in err


def test_a_card_shows_prompt_feedback_siblings_and_the_legend(run, tmp_path):
    rid = "r00000005"
    text = write_report(run, tmp_path / "one.html", ids=[rid]).read_text()
    card = text[text.index(f'<div class="card" id="{rid}">'):]
    response, _ = analysis.response_detail(connect(run), rid)
    assert f'<details class="prompt"><summary>prompt</summary><pre>{html.escape(response["prompt"])}</pre>' in card
    for feedback in response["feedback"]:
        assert f'<div class="feedback">{html.escape(feedback)}</div>' in card
    siblings = analysis.siblings(connect(run), rid)
    assert len(siblings) == 3 and rid not in siblings  # groups of 4
    folded = card[card.index('<details class="siblings">'):]
    assert all(f'<a href="#{s}">{s}</a> · A_gdpo' in folded for s in siblings)
    assert '<details class="siblings" open' not in text
    assert '<div class="legend">' in text and "|A| &lt; 0.01 is white" in text


def scaled(table: pa.Table, response_id: str, columns: tuple[str, ...], factor: float) -> pa.Table:
    """`table` with `columns` (numbers or lists of numbers) multiplied by `factor` on one response's rows."""
    rows = table.to_pylist()
    for row in rows:
        if row["response_id"] == response_id:
            for column in columns:
                value = row[column]
                row[column] = [v * factor for v in value] if isinstance(value, list) else value * factor
    return pa.Table.from_pylist(rows, schema=table.schema)


def test_an_advantage_below_the_floor_is_white(run, tmp_path):
    """A response whose advantages are all ~1e-8 must not become its own colour scale and paint solid."""
    rid = "r00000005"
    tables = _tables(run)
    tables = {"credits": scaled(tables["credits"], rid, ("advantage", "reward_adv"), 1e-8),
              "responses": scaled(tables["responses"], rid, ("gdpo_sum", "mrtpo_sum"), 1e-8)}
    tiny = tmp_path / "tiny"
    writer = RunWriter(str(tiny))
    writer.start("tiny", {"credit": {"gdpo": {"batch": "none"}}}, "tiny", "test")  # views: A = the stored sums
    writer.write_shard(0, tables, {})
    writer.finish(1, {})

    def alphas(floor: float) -> set[str]:
        text = write_report(tiny, tmp_path / f"floor-{floor}.html", ids=[rid], floor=floor).read_text()
        start = text.index(f'<div class="card" id="{rid}">')
        card = text[start:text.index('<div class="row">') if '<div class="row">' in text
                    else text.index('<details class="siblings">')]
        return set(re.findall(r'class="tok" data-p="\d+" style="background:rgba\([\d,]+,([\d.]+)\)', card))

    assert alphas(0.01) == {"0.000"}
    assert "0.850" in alphas(0.0)  # without a floor the 1e-8 advantages would be drawn at full strength


# --- what a reader looks for first, labels, one colour scale per reward (issue 51) -------------


def test_the_report_opens_with_what_failed_where_and_folds_the_metadata(run, report):
    _, text = report
    body = text[text.index("<body>"):]
    summary = body[body.index('<section id="failures">'):body.index("</section>")]
    assert body.index('<section id="failures">') < body.index('<details class="run">') < body.index("<nav>")
    folded = body[body.index('<details class="run">'):body.index("<nav>")]
    assert "replays done / skipped" in folded and "code version" in folded and "dataset checksum" in folded
    assert "replays done" not in summary and "gated" not in summary
    con = connect(run)
    failing = [r for r in analysis.reward_summary(con).to_pylist() if r["pass_rate"] < 1]
    items = re.findall(r'<li><a href="#task-([^"]+)">[^<]+</a>: <b>([^<]+)</b> failed on (\d+) of (\d+) responses',
                       summary)
    assert sorted(items) == sorted((r["task"], html.escape(r["reward"]), str(round(r["responses"] * (1 - r["pass_rate"]))),
                                    str(r["responses"])) for r in failing)
    sql = [item[1] for item in items if item[0] == "sql"]  # most failures first
    rates = {r["reward"]: r["pass_rate"] for r in failing if r["task"] == "sql"}
    assert [rates[name] for name in sql] == sorted(rates[name] for name in sql)
    assert re.search(r"the replay puts \d+% of its blame on the \w+ \(\d+% of the tokens\)", summary)


def svg_labels(svg: str) -> tuple[int, list[tuple[float, str]]]:
    """An SVG's width and its right-aligned labels (x, text)."""
    width = int(re.match(r'<svg width="(\d+)"', svg).group(1))
    return width, [(float(x), html.unescape(t)) for x, t in
                   re.findall(r'<text x="([\d.]+)" y="[\d.]+" font-size="12" text-anchor="end">([^<]*)</text>', svg)]


def test_a_long_reward_label_is_never_cut():
    from tokencredit.pipeline.dataset.report import CHAR_W, share_bars_svg

    long = "instructions/keyword_exclude_with_a_very_long_name [verifier]"
    width, labels = svg_labels(share_bars_svg([("", [("format", 0.5, 0.3), (long, 0.2, 0.3)])]))
    # a label ends at x (text-anchor end): it is whole when it starts right of 0 at the widest character
    assert [text for _, text in labels] == ["format", long]
    assert all(x - CHAR_W * len(text) >= 0 for x, text in labels)
    assert width >= max(x for x, _ in labels) + 250
    heading = "a heading longer than every label of its group, in its own words (24 replays)"
    width, _ = svg_labels(share_bars_svg([(heading, [("format", 0.5, 0.3)])]))
    assert width >= CHAR_W * len(heading)


def strips(card: str) -> dict[str, list[str]]:
    """Per reward row of a card, the shade alphas of its GDPO and MRTPO strips."""
    rows = re.split(r'<div class="reward"><b>', card)[1:]
    return {row[:row.index("</b>")]: re.findall(r'style="background:rgba\([\d,]+,([\d.]+)\)', row) for row in rows}


def test_one_colour_scale_per_reward_across_cards_or_one_per_card(run, tmp_path):
    con = connect(run)
    ids = analysis.chosen_responses(con, 3)["sql"]
    details = [analysis.response_detail(con, rid) for rid in ids]
    text = write_report(run, tmp_path / "reward.html", ids=ids).read_text()
    per_card = write_report(run, tmp_path / "card.html", ids=ids, scale="card").read_text()
    names = details[0][0]["reward_names"]
    for name in names:
        largest = max(abs(v) for response, per_reward in details for k, cs in enumerate(per_reward)
                      if response["reward_names"][k] == name for c in cs for v in (c["advantage"], c["reward_adv"]))
        shown = set(re.findall(rf'<b>{re.escape(name)}</b>.*?scale ±([\d.]+)</span>', text))
        assert shown == {f"{largest:.3f}"}  # the same scale on every card
        # the strongest shade of the reward is drawn at full strength on one card only, the others lighter
        full = [max(map(float, strips(card)[name])) for card in text.split('<div class="card" ')[1:]]
        assert max(full) == 0.85
    headings = re.findall(r"colour scale ±([\d.]+)</span></h3>", per_card)
    assert len(headings) == len(ids) and "scale ±" not in "".join(re.findall(r'<div class="reward">.*?</div>',
                                                                           per_card))
    assert "one scale per reward" in text and "one scale per response" in per_card
    assert main(["report", str(run), "--dest", str(tmp_path / "cli.html"), "--ids", ",".join(ids), "--scale",
                 "card"]) == 0
    assert (tmp_path / "cli.html").read_text() == per_card
    with pytest.raises(ValueError, match="scale 'reward card': one of reward, card"):
        write_report(run, tmp_path / "x.html", scale="reward card")
