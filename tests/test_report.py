"""The HTML credit report: content, escaping, self-containment, and a headless Chromium render."""
import html
import re
import shutil
import subprocess

import pytest

from pipeline import analysis
from pipeline.query import connect
from pipeline.report import shade, token_texts, write_report

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
            assert text.count(f"<h3>{rid} ") == 1
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
