"""A self-contained HTML credit report of one run: `write_report(out)` -> OUT/report.html.

One file, no network: inline CSS, inline SVG charts, and a few lines of inline JS (token
cross-highlighting; it sets `data-ok` on <body> once it ran, which the headless-browser test
checks). Per task it shows the reward distributions, where the replay distance falls (the MRTPO
paper's Figure 6) and a few responses shaded token by token by each reward's advantage under GDPO
and MRTPO (its Figures 1 and 2). Every text from the run is HTML-escaped.
"""
from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.fs as pafs

from . import analysis
from .query import connect

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; color: #1f2937; margin: 24px auto; max-width: 1240px; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 8px; } h2 { border-bottom: 2px solid #e5e7eb; padding-top: 16px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
table { border-collapse: collapse; } td, th { padding: 3px 10px; text-align: left; border-bottom: 1px solid #eee; }
th { font-weight: 600; color: #4b5563; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.note { background: #fef9c3; border-left: 4px solid #eab308; padding: 6px 10px; margin: 8px 0; }
.figs { display: flex; flex-wrap: wrap; gap: 24px; } figure { margin: 0; }
figcaption { color: #4b5563; font-size: 12px; max-width: 560px; }
.card { border: 1px solid #e5e7eb; border-radius: 6px; padding: 10px 12px; margin: 12px 0; }
.panels { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; }
.panel h4 { margin: 4px 0; font-size: 13px; color: #374151; }
.row { margin: 4px 0 8px; } .label { font-size: 12px; color: #4b5563; }
.strip { font: 12px/1.9 ui-monospace, monospace; white-space: pre-wrap; word-break: break-all; }
.tok { border-radius: 2px; padding: 1px 0; } .tok.hl { outline: 2px solid #1d4ed8; }
.chip { display: inline-block; background: #f3f4f6; border-radius: 10px; padding: 0 8px; margin: 2px 4px 2px 0;
        font-size: 12px; }
nav a { margin-right: 12px; } pre { background: #f9fafb; padding: 8px; overflow: auto; font-size: 12px; }
"""

# Hovering a token outlines the same position in every row of its response.
JS = """
for (const card of document.querySelectorAll('.card')) {
  card.addEventListener('mouseover', e => {
    const p = e.target.dataset && e.target.dataset.p;
    if (p === undefined) return;
    for (const t of card.querySelectorAll('.tok.hl')) t.classList.remove('hl');
    for (const t of card.querySelectorAll('.tok[data-p="' + p + '"]')) t.classList.add('hl');
  });
}
document.body.dataset.ok = '1';
"""

GREEN, RED = "22,163,74", "220,38,38"
BAR, BASELINE = "#2563eb", "#6b7280"


def _num(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


# --- charts ------------------------------------------------------------------------------------

def histogram_svg(counts: list[int], width: int = 150, height: int = 36) -> str:
    """Bars of 10 score bins over [0, 1], labelled 0 and 1 under the axis."""
    top, bar_w = max(max(counts), 1), width / len(counts)
    bars = "".join(
        f'<rect x="{i * bar_w + 1:.1f}" y="{height - 12 - (height - 14) * n / top:.1f}" width="{bar_w - 2:.1f}" '
        f'height="{(height - 14) * n / top:.1f}" fill="{BAR}"><title>[{i / 10:.1f}, {(i + 1) / 10:.1f}'
        f'{"]" if i == 9 else ")"}: {n}</title></rect>' for i, n in enumerate(counts))
    return (f'<svg width="{width}" height="{height}" role="img">{bars}'
            f'<line x1="0" x2="{width}" y1="{height - 12}" y2="{height - 12}" stroke="#9ca3af"/>'
            f'<text x="0" y="{height - 1}" font-size="10">0</text>'
            f'<text x="{width}" y="{height - 1}" font-size="10" text-anchor="end">1</text></svg>')


def share_bars_svg(groups: list[tuple[str, list[tuple[str, float, float]]]], width: int = 520) -> str:
    """Horizontal bars of shares in [0, 1]: per group a heading, per item (label, share, baseline)
    a blue bar with the baseline as a gray tick."""
    label_w, bar_w, line = 150, width - 150 - 120, 18
    parts, y = [], 4
    for heading, items in groups:
        if heading:
            parts.append(f'<text x="0" y="{y + 12}" font-size="12" font-weight="600">{escape(heading)}</text>')
            y += line
        for label, share, baseline in items:
            x_base = label_w + bar_w * baseline
            parts.append(
                f'<text x="{label_w - 6}" y="{y + 12}" font-size="12" text-anchor="end">{escape(label)}</text>'
                f'<rect x="{label_w}" y="{y + 2}" width="{bar_w}" height="12" fill="#f3f4f6"/>'
                f'<rect x="{label_w}" y="{y + 2}" width="{bar_w * share:.1f}" height="12" fill="{BAR}"/>'
                f'<line x1="{x_base:.1f}" x2="{x_base:.1f}" y1="{y}" y2="{y + 16}" stroke="{BASELINE}" '
                f'stroke-width="3"/>'
                f'<text x="{label_w + bar_w + 6}" y="{y + 12}" font-size="11">{share:.2f} '
                f'<tspan fill="{BASELINE}">(uniform {baseline:.2f})</tspan></text>')
            y += line
    return f'<svg width="{width}" height="{y + 4}" role="img">{"".join(parts)}</svg>'


# --- token strips ------------------------------------------------------------------------------

def shade(value: float, scale: float) -> str:
    """CSS background for an advantage: green if positive, red if negative, opacity by |value| / scale."""
    alpha = 0.0 if scale <= 0 else min(1.0, abs(value) / scale) * 0.85
    return f"background:rgba({GREEN if value >= 0 else RED},{alpha:.3f})"


def token_texts(response: str, credits: list[dict]) -> list[str]:
    """Each token's text: its character span of the response (what the reader sees), else token_text."""
    texts = []
    for c in credits:
        start, end = c["char_start"], c["char_end"]
        text = response[start:end] if response and start is not None and end is not None and end > start \
            else c["token_text"] or ""
        texts.append(text.replace("\n", "↵\n") or "∅")
    return texts


def token_strip(texts: list[str], values: list[float], tips: list[str], scale: float) -> str:
    return '<div class="strip">' + "".join(
        f'<span class="tok" data-p="{t}" style="{shade(v, scale)}" title="{escape(tip)}">{escape(text)}</span>'
        for t, (text, v, tip) in enumerate(zip(texts, values, tips))) + "</div>"


def _row(label: str, strip: str) -> str:
    return f'<div class="row"><div class="label">{label}</div>{strip}</div>'


def response_card(response: dict, by_reward: dict[str, list[dict]]) -> str:
    """One response: per reward a row of token advantages, GDPO (uniform) and MRTPO side by side."""
    names = [n for n in response["reward_names"] if n in by_reward]
    if not names:
        return f'<div class="card"><b>{escape(response["response_id"])}</b>: no credit rows.</div>'
    credits = by_reward[names[0]]
    texts = token_texts(response["response"], credits)
    T = len(credits)
    adv_mrtpo = response["adv_mrtpo"] or []
    rows = {n: by_reward[n] for n in names}
    scale = max([abs(c["advantage"] or 0) for cs in rows.values() for c in cs]
                + [abs(c["reward_adv"] or 0) for cs in rows.values() for c in cs]
                + [abs(a) for a in adv_mrtpo] + [abs(response["adv_gdpo"] or 0)])
    gdpo, mrtpo = [], []
    for name in names:
        cs = rows[name]
        adv_k = cs[0]["reward_adv"] or 0.0
        replayed = cs[0]["distance"] is not None
        label = f'{escape(name)} · A = {adv_k:+.3f}' + ("" if replayed else " · not replayed (uniform)")
        tips = [f'#{c["position"]} {text!r} · part {c["part"]} · d {_num(c["distance"], 4)} · '
                f'w {_num(c["weight"], 2)} · A {_num(c["advantage"])}' for c, text in zip(cs, texts)]
        gdpo.append(_row(label, token_strip(texts, [adv_k] * T, tips, scale)))
        mrtpo.append(_row(label, token_strip(texts, [c["advantage"] or 0.0 for c in cs], tips, scale)))
    total = response["adv_gdpo"] or 0.0
    gdpo.append(_row(f"<b>total</b> A_gdpo = {total:+.3f}",
                     token_strip(texts, [total] * T, [f"A_gdpo {total:.3f}"] * T, scale)))
    if len(adv_mrtpo) == T:
        mrtpo.append(_row("<b>total</b> A_mrtpo", token_strip(
            texts, adv_mrtpo, [f"#{t} A_mrtpo {a:.3f}" for t, a in enumerate(adv_mrtpo)], scale)))
    else:
        mrtpo.append('<div class="label">MRTPO was not computed for this response.</div>')
    chips = "".join(f'<span class="chip">{escape(n)}: {s:g}</span>'
                    for n, s in zip(response["reward_names"], response["rewards"]))
    p2t = ""
    adv_p2t = response["adv_p2t"]
    if adv_p2t and len(adv_p2t) == T:
        p2t_scale = max(abs(a) for a in adv_p2t)
        p2t = _row(f"P2T token advantage (own scale, max |A| {p2t_scale:.3f})", token_strip(
            texts, adv_p2t, [f"#{t} A_p2t {a:.3f}" for t, a in enumerate(adv_p2t)], p2t_scale))
    return (f'<div class="card"><h3>{escape(response["response_id"])} '
            f'<span class="label">prompt {escape(response["group_id"])} · {T} tokens · '
            f'colour scale ±{scale:.3f}</span></h3>{chips}'
            f'<div class="panels"><div class="panel"><h4>GDPO: each reward\'s advantage on every token</h4>'
            f'{"".join(gdpo)}</div><div class="panel"><h4>MRTPO: reallocated by replay distance</h4>'
            f'{"".join(mrtpo)}</div></div>{p2t}</div>')


# --- sections ----------------------------------------------------------------------------------

def header(manifest: dict[str, Any], counts: dict[str, int]) -> str:
    stats = manifest.get("stats", {})
    items = [("run", manifest.get("run_id")), ("schema version", manifest.get("schema_version")),
             ("code version", manifest.get("code_version")),
             ("dataset checksum", (manifest.get("dataset_checksum") or "")[:16]),
             ("responses (ok / all)", f'{counts["ok"]} / {counts["responses"]}'),
             ("prompts", counts["prompts"]), ("credit rows", counts["credit_rows"]),
             ("credit rows with replay distance", counts["replayed_rows"]),
             ("rejected prompt records", manifest.get("rejected"))]
    if "replays_done" in stats:
        done, skipped = stats["replays_done"], stats.get("replays_skipped", 0)
        items.append(("replays done / skipped (gated)",
                      f"{done} / {skipped} ({skipped / max(done + skipped, 1):.0%} skipped)"))
    if "tokens_replayed" in stats:
        items.append(("tokens replayed", stats["tokens_replayed"]))
    if stats.get("p2t_responses"):
        items.append(("P2T near-flat rate", f'{stats.get("p2t_near_flat", 0) / stats["p2t_responses"]:.1%} '
                                             f'of {stats["p2t_responses"]} responses'))
    table = "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in items if v is not None)
    config = escape(json.dumps(manifest.get("config", {}), indent=2, sort_keys=True))
    note = "" if counts["replayed_rows"] else (
        '<p class="note">MRTPO was not computed in this run (no replay distances): the shares of '
        'Figure 6 are not available and MRTPO advantages equal GDPO\'s.</p>')
    return (f'<h1>tokencredit credit report: {escape(str(manifest.get("run_id", "")))}</h1>'
            f'<table>{table}</table><details><summary>config</summary><pre>{config}</pre></details>{note}')


def reward_table(summary: list[dict], hist: dict[tuple[str, str], list[int]]) -> str:
    body = "".join(
        f'<tr><td>{escape(r["reward"])}</td><td class="num">{r["responses"]}</td>'
        f'<td class="num">{_num(r["mean_score"])}</td><td class="num">{_num(r["pass_rate"])}</td>'
        f'<td>{histogram_svg(hist.get((r["task"], r["reward"]), [0] * 10))}</td></tr>' for r in summary)
    return ('<table><tr><th>reward</th><th>responses</th><th>mean score</th><th>pass rate</th>'
            f'<th>score histogram</th></tr>{body}</table>')


def share_figures(top: list[dict], parts: list[dict]) -> str:
    if not top:
        return ('<p class="note">No replay distances for this task (MRTPO was not computed, or every '
                'group was gated).</p>')
    top_svg = share_bars_svg([("", [(r["reward"], r["top_share"], r["uniform_share"]) for r in top])])
    groups: dict[str, list[tuple[str, float, float]]] = {}
    for r in parts:
        groups.setdefault(f'{r["reward"]} ({r["replays"]} replays)', []).append(
            (r["part"], r["distance_share"], r["token_share"]))
    return (f'<div class="figs"><figure>{top_svg}<figcaption>Share of each reward\'s replay distance held '
            f'by the top {analysis.TOP_K} tokens of a response (mean over replays); gray: uniform '
            f'({analysis.TOP_K} / T).</figcaption></figure>'
            f'<figure>{share_bars_svg(list(groups.items()))}<figcaption>Share of each reward\'s replay '
            'distance on each part of the response; gray: the part\'s share of tokens.'
            '</figcaption></figure></div>')


def task_section(task: str, con: duckdb.DuckDBPyConnection, data: dict[str, Any], chosen: list[str]) -> str:
    def of_task(rows: list[dict]) -> list[dict]:
        return [r for r in rows if r["task"] == task]

    cards = "".join(response_card(*analysis.response_detail(con, rid)) for rid in chosen)
    return (f'<section id="task-{escape(task)}"><h2>{escape(task)}</h2><h3>Rewards</h3>'
            f'{reward_table(of_task(data["summary"]), data["hist"])}'
            f'<h3>Where the replay distance falls</h3>{share_figures(of_task(data["top"]), of_task(data["parts"]))}'
            f'<h3>Responses</h3><p class="label">Token shading: green positive, red negative advantage, '
            f'intensity by magnitude on one scale per response; hover a token for its distance d, weight w '
            f'and advantage A.</p>{cards or "<p>No credited responses.</p>"}</section>')


def render(con: duckdb.DuckDBPyConnection, manifest: dict[str, Any], responses_per_task: int = 2) -> str:
    """The report's HTML for a connection from `connect(out)` and the run's manifest."""
    data = {"summary": analysis.reward_summary(con).to_pylist(), "hist": analysis.score_histograms(con),
            "top": analysis.top_share(con).to_pylist(), "parts": analysis.part_share(con).to_pylist()}
    counts = analysis.rows(con, analysis.COUNTS_SQL)[0]
    chosen = analysis.chosen_responses(con, responses_per_task)
    tasks = sorted({r["task"] for r in analysis.rows(con, "SELECT DISTINCT task FROM responses")})
    nav = "".join(f'<a href="#task-{escape(t)}">{escape(t)}</a>' for t in tasks)
    sections = "".join(task_section(t, con, data, chosen.get(t, [])) for t in tasks)
    title = escape(f'tokencredit report: {manifest.get("run_id", "")}')
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f'<style>{CSS}</style></head><body>{header(manifest, counts)}<nav>{nav}</nav>{sections}'
            f'<script>{JS}</script></body></html>')


def _filesystem(out: str) -> tuple[pafs.FileSystem, str]:
    if "://" in out:
        return pafs.FileSystem.from_uri(out)
    return pafs.LocalFileSystem(), str(Path(out).resolve())


def write_report(out: str | Path, dest: str | Path | None = None, responses_per_task: int = 2) -> Path:
    """Write the HTML report of run directory `out` to `dest` (default OUT/report.html)."""
    out = str(out)
    con = connect(out)
    fs, root = _filesystem(out)
    try:
        with fs.open_input_stream(f"{root}/manifest.json") as stream:
            manifest = json.loads(stream.read())
    except FileNotFoundError:
        manifest = {}  # an unfinished run: the tables are still worth a report
    html = render(con, manifest, responses_per_task)
    if dest is None:
        dest_fs, path = fs, f"{root}/report.html"
    else:
        dest_fs, path = _filesystem(str(dest))
    with dest_fs.open_output_stream(path) as stream:
        stream.write(html.encode())
    return Path(path)
