"""A self-contained HTML credit report of one run: `write_report(out)` -> OUT/report.html.

One file, no network: inline CSS, inline SVG charts, and a few lines of inline JS (token
cross-highlighting; it sets `data-ok` on <body> once it ran, which the headless-browser test
checks). It opens with what failed: per task, the rewards that failed on some responses, in plain words, and
where in a response the replay puts their blame; the run's metadata is folded below. Per task it shows the reward
distributions, where the replay distance falls (the MRTPO paper's Figure 6, labels never cut) and a few responses
shaded token by token by each reward's advantage under GDPO and MRTPO (its Figures 1 and 2), on one colour scale
per reward across the task's cards (`scale="card"`: one per card). Each response shown is anchored at its row id,
so `report.html#<response_id>` opens it (`responses.response_id`). Every text from the run is HTML-escaped.
"""
from __future__ import annotations

import json
from collections.abc import Container
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote

import duckdb

from tokencredit.pipeline.dataset import analysis
from tokencredit.pipeline.dataset.query import connect
from tokencredit.pipeline.dataset.writer import filesystem, run_files

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
pre { white-space: pre-wrap; max-height: 320px; }
.grid { display: grid; grid-template-columns: minmax(180px, 1fr) 2fr 2fr; gap: 6px 14px; align-items: start; }
.grid .head { font-size: 12px; font-weight: 600; color: #374151; border-bottom: 1px solid #e5e7eb; }
.reward { font-size: 12px; } .feedback { color: #4b5563; font-size: 11px; margin-top: 2px; }
details.prompt, details.siblings { margin: 6px 0; } summary { cursor: pointer; color: #1d4ed8; font-size: 12px; }
.sibling { border-top: 1px dashed #e5e7eb; padding: 6px 0; }
.legend { display: flex; align-items: center; gap: 10px; margin: 12px 0; font-size: 12px; flex-wrap: wrap; }
.failed li { margin: 3px 0; } details.run { margin: 10px 0; }
.legend .ramp { display: inline-block; width: 220px; height: 14px; border: 1px solid #d1d5db; }
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


CHAR_W = 7.5  # px: an upper bound on a 12 px sans-serif character's width, so that no label is cut


def text_width(text: str) -> float:
    return CHAR_W * len(text)


def share_bars_svg(groups: list[tuple[str, list[tuple[str, float, float]]]], bar_w: int = 250) -> str:
    """Horizontal bars of shares in [0, 1]: per group a heading, per item (label, share, baseline)
    a blue bar with the baseline as a gray tick. The labels' margin is the longest label's width (px)."""
    labels = [label for _, items in groups for label, _, _ in items]
    label_w = round(max(map(text_width, labels), default=0)) + 12
    width = max([label_w + bar_w + 130, *(round(text_width(heading)) + 4 for heading, _ in groups)])
    line = 18
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

FLOOR = 0.01  # |advantage| below this is drawn white: numerical noise, not credit


def shade(value: float, scale: float, floor: float = 0.0) -> str:
    """CSS background for an advantage: white below `floor`, else green if positive, red if
    negative, opacity by |value| / scale."""
    alpha = 0.0 if scale <= 0 or abs(value) < floor else min(1.0, abs(value) / scale) * 0.85
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


def token_strip(texts: list[str], values: list[float], tips: list[str], scale: float, floor: float = 0.0) -> str:
    return '<div class="strip">' + "".join(
        f'<span class="tok" data-p="{t}" style="{shade(v, scale, floor)}" title="{escape(tip)}">{escape(text)}</span>'
        for t, (text, v, tip) in enumerate(zip(texts, values, tips))) + "</div>"


def colour_scale(values: list[float], floor: float) -> float:
    """One response's colour scale: its largest |advantage|, never below the floor (a response
    whose advantages are all ~1e-9 must not paint itself solid)."""
    return max([abs(v) for v in values] + [floor])


SCALES = ("reward", "card")  # write_report's `scale`: one per reward across a task's cards, or one per card


def legend(floor: float, scale: str = "reward") -> str:
    gradient = f"linear-gradient(to right, rgba({RED},0.85), rgba({RED},0) 50%, rgba({GREEN},0) 50%, rgba({GREEN},0.85))"
    which = ("Each reward has one colour scale across its task's responses, its largest |advantage| there (shown "
             "beside it), so that a shade is the same advantage on every card" if scale == "reward" else
             "Each response has one colour scale, its largest |advantage| (shown in its heading)")
    return (f'<div class="legend"><span>−scale: debited</span><span class="ramp" style="background:{gradient}">'
            f'</span><span>+scale: credited</span><span class="label">{which}; |A| &lt; {floor:g} is white.'
            f'</span></div>')


def reward_scales(details: list[tuple[dict, list[list[dict]]]], floor: float) -> dict[str, float]:
    """The colour scales shared by the cards of `details` ((response, per_reward) pairs): per reward name its
    largest |advantage| (GDPO's and MRTPO's) over every card, 'total' over the totals, 'p2t' over P2T's."""
    values: dict[str, list[float]] = {"total": [], "p2t": []}
    for response, per_reward in details:
        for k, cs in enumerate(per_reward):
            values.setdefault(response["reward_names"][k], []).extend(
                [c["advantage"] or 0 for c in cs] + [c["reward_adv"] or 0 for c in cs])
        values["total"] += (response["adv_mrtpo"] or []) + [response["adv_gdpo"] or 0.0]
        values["p2t"] += response["adv_p2t"] or []
    return {name: colour_scale(vs, floor) for name, vs in values.items()}


_SOURCE_NOTES = {"verifier": "located by the verifier's spans", "replay": "located by the replay",
                 "uniform": "not located (uniform)"}


def _reward_label(name: str, score: float, adv: float, feedback: str, source: str | None,
                  scale: float | None = None) -> str:
    """`source`: where the reward's relevance came from (credits.relevance_source); None: a run without it.
    `scale`: the reward's colour scale, where it is shared across cards."""
    note = f' · <span class="label">{_SOURCE_NOTES.get(source, escape(str(source)))}</span>' if source else ""
    shared = f' · <span class="label scale">scale ±{scale:.3f}</span>' if scale is not None else ""
    return (f'<div class="reward"><b>{escape(name)}</b> <span class="chip">score {score:g}</span> '
            f'A = {adv:+.3f}{note}{shared}<div class="feedback">{escape(feedback or "")}</div></div>')


def response_link(response_id: str) -> str:
    """A response's row id (`responses.response_id`), shown as a link to its anchor: `report.html#<response_id>`."""
    return f'<a href="#{escape(quote(response_id, safe="/"))}">{escape(response_id)}</a>'


def anchor(response_id: str) -> str:
    return f'id="{escape(response_id)}"'


def response_card(response: dict, per_reward: list[list[dict]], floor: float = FLOOR,
                  siblings: list[tuple[dict, list[list[dict]]]] = (), anchored_siblings: Container[str] = (),
                  scales: dict[str, float] | None = None) -> str:
    """One response, anchored at its row id: its prompt, then per reward its score and feedback beside
    that reward's token advantages, GDPO (uniform) and MRTPO side by side; the prompt group's other
    responses on demand (those in `anchored_siblings` carry their anchor here). `scales`: the colour scale of
    each reward, 'total' and 'p2t' (`reward_scales`), shared with other cards; None: one scale for this card."""
    rows = [(k, cs) for k, cs in enumerate(per_reward) if cs]
    rid = response["response_id"]
    if not rows:
        return f'<div class="card" {anchor(rid)}><b>{response_link(rid)}</b>: no credit rows.</div>'
    texts = token_texts(response["response"], rows[0][1])
    T = len(rows[0][1])
    adv_mrtpo = response["adv_mrtpo"] or []
    total = response["adv_gdpo"] or 0.0
    card = colour_scale([c["advantage"] or 0 for _, cs in rows for c in cs]
                        + [c["reward_adv"] or 0 for _, cs in rows for c in cs] + adv_mrtpo + [total], floor)
    shared = scales is not None
    scales = scales or {}
    grid = []
    for k, cs in rows:
        adv_k = cs[0]["reward_adv"] or 0.0
        scale = scales.get(response["reward_names"][k], card)
        tips = [f'#{c["position"]} {text!r} · part {c["part"]} · d {_num(c["distance"], 4)} · '
                f'w {_num(c["weight"], 2)} · A {_num(c["advantage"])}' for c, text in zip(cs, texts)]
        grid += [_reward_label(response["reward_names"][k], response["rewards"][k], adv_k,
                               (response["feedback"] or [""] * len(per_reward))[k], _source(cs[0]),
                               scale if shared else None),
                 token_strip(texts, [adv_k] * T, tips, scale, floor),
                 token_strip(texts, [c["advantage"] or 0.0 for c in cs], tips, scale, floor)]
    scale = scales.get("total", card)
    mrtpo_total = (token_strip(texts, adv_mrtpo, [f"#{t} A_mrtpo {a:.3f}" for t, a in enumerate(adv_mrtpo)],
                               scale, floor) if len(adv_mrtpo) == T
                   else '<div class="label">MRTPO was not computed for this response.</div>')
    total_scale = f' · <span class="label scale">scale ±{scale:.3f}</span>' if shared else ""
    grid += [f'<div class="reward"><b>total</b> A_gdpo = {total:+.3f}{total_scale}</div>',
             token_strip(texts, [total] * T, [f"A_gdpo {total:.3f}"] * T, scale, floor), mrtpo_total]
    p2t = ""
    adv_p2t = response["adv_p2t"]
    if adv_p2t and len(adv_p2t) == T:
        p2t_scale = scales.get("p2t", colour_scale(adv_p2t, floor))
        whose = "P2T's scale across the task's cards" if shared else "own scale"
        p2t = (f'<div class="row"><div class="label">P2T token advantage ({whose}, max |A| {p2t_scale:.3f})</div>'
               + token_strip(texts, adv_p2t, [f"#{t} A_p2t {a:.3f}" for t, a in enumerate(adv_p2t)], p2t_scale, floor)
               + "</div>")
    return (f'<div class="card" {anchor(rid)}><h3>{response_link(rid)} '
            f'<span class="label">prompt {escape(response["group_id"])} · {T} tokens'
            f'{"" if shared else f" · colour scale ±{card:.3f}"}</span></h3>'
            f'<details class="prompt"><summary>prompt</summary><pre>{escape(response["prompt"] or "")}</pre></details>'
            f'<div class="grid"><div class="head">reward, score and feedback</div>'
            f'<div class="head">GDPO: the reward\'s advantage on every token</div>'
            f'<div class="head">MRTPO: reallocated by replay distance</div>{"".join(grid)}</div>'
            f'{p2t}{sibling_list(siblings, floor, anchored_siblings)}</div>')


def _source(credit: dict) -> str | None:
    """A reward's relevance source; a run of schema 2.1 has none: replayed where it has a distance."""
    if credit.get("relevance_source") is not None:
        return credit["relevance_source"]
    return "replay" if credit["distance"] is not None else "uniform"


def sibling_list(siblings: list[tuple[dict, list[list[dict]]]], floor: float, anchored: Container[str] = ()) -> str:
    """The prompt group's other responses, folded: scores and total token advantage of each, its row id
    a link to its anchor, which those in `anchored` carry here."""
    if not siblings:
        return ""
    items = []
    for response, per_reward in siblings:
        credits = next((cs for cs in per_reward if cs), [])
        chips = "".join(f'<span class="chip">{escape(n)}: {s:g}</span>'
                        for n, s in zip(response["reward_names"] or [], response["rewards"] or []))
        adv_gdpo = response["adv_gdpo"]
        values = response["adv_mrtpo"] or [adv_gdpo or 0.0] * len(credits)
        kind = "A_mrtpo" if response["adv_mrtpo"] else "A_gdpo"
        strip = (token_strip(token_texts(response["response"], credits), values,
                             [f"#{t} {kind} {a:.3f}" for t, a in enumerate(values)], colour_scale(values, floor), floor)
                 if credits and len(values) == len(credits) else f'<pre>{escape(response["response"] or "")}</pre>')
        rid = response["response_id"]
        items.append(f'<div class="sibling"{" " + anchor(rid) if rid in anchored else ""}>'
                     f'<div class="label">{response_link(rid)} · '
                     f'A_gdpo {_num(adv_gdpo)} · shaded by {kind} (own scale)</div>{chips}{strip}</div>')
    return (f'<details class="siblings"><summary>the other {len(siblings)} responses to this prompt</summary>'
            f'{"".join(items)}</details>')


# --- sections ----------------------------------------------------------------------------------

def header(manifest: dict[str, Any], counts: dict[str, int]) -> str:
    stats = manifest.get("stats", {})
    items = [("run", manifest.get("run_id")), ("schema version", manifest.get("schema_version")),
             ("code version", manifest.get("code_version")),
             ("dataset checksum", (manifest.get("dataset_checksum") or "")[:16]),
             ("responses (ok / all)", f'{counts["ok"]} / {counts["responses"]}'),
             ("prompts", counts["prompts"]), ("credit rows", counts["credit_rows"]),
             ("credit rows with a relevance (replay or verifier spans)", counts["replayed_rows"]),
             ("credit rows located by the verifier's spans", counts.get("verifier_rows")),
             ("rejected prompt records", manifest.get("rejected"))]
    if "replays_done" in stats:
        done, skipped = stats["replays_done"], stats.get("replays_skipped", 0)
        items.append(("replays done / skipped (gated)",
                      f"{done} / {skipped} ({skipped / max(done + skipped, 1):.0%} skipped)"))
    if "verifier_located" in stats:
        items.append(("pairs located by the verifier (replay skipped)", stats["verifier_located"]))
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
    return (f'{note}<details class="run"><summary>about this run: {counts["responses"]} responses to '
            f'{counts["prompts"]} prompts, its versions, counts and config</summary><table>{table}</table>'
            f'<details><summary>config</summary><pre>{config}</pre></details></details>')


def failures(tasks: list[str], data: dict[str, Any]) -> str:
    """What a reader looks for first: per task, the rewards that failed on some responses, most failures first,
    in plain words, with the part of a response where most of the reward's replay distance falls; then the
    rewards that passed on every response."""
    where = {}
    for r in data["parts"]:
        key = (r["task"], _by(r))
        if key not in where or r["distance_share"] > where[key]["distance_share"]:
            where[key] = r
    items, passed = [], []
    for task in tasks:
        rows = [r for r in data["summary"] if r["task"] == task and r["pass_rate"] is not None]
        for r in sorted(rows, key=lambda r: (r["pass_rate"], r["reward"])):
            failed = round(r["responses"] * (1 - r["pass_rate"]))
            if not failed:
                passed.append(f'{escape(r["reward"])} ({escape(task)})')
                continue
            part = where.get((task, r["reward"]))
            blamed = (f'; the replay puts {part["distance_share"]:.0%} of its blame on the {escape(part["part"])} '
                      f'({part["token_share"]:.0%} of the tokens)' if part and part["token_share"] < 1 else "")
            items.append(f'<li><a href="#task-{escape(task)}">{escape(task)}</a>: <b>{escape(r["reward"])}</b> '
                         f'failed on {failed} of {r["responses"]} responses ({1 - r["pass_rate"]:.0%}){blamed}</li>')
    failed_list = f'<ul class="failed">{"".join(items)}</ul>' if items else "<p>No reward failed on any response.</p>"
    all_passed = f'<p>Passed on every response: {", ".join(passed)}.</p>' if passed else ""
    return (f'<section id="failures"><h2>What failed, and where</h2>{failed_list}{all_passed}'
            '<p class="label">A reward fails on a response when its score is below 1. Below, per task: the '
            'score distributions, where the replay distance falls, and responses shaded token by token.</p>'
            '</section>')


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
    top_svg = share_bars_svg([("", [(_by(r), r["top_share"], r["uniform_share"]) for r in top])])
    groups: dict[str, list[tuple[str, float, float]]] = {}
    for r in parts:
        groups.setdefault(f'{_by(r)} ({r["replays"]} replays)', []).append(
            (r["part"], r["distance_share"], r["token_share"]))
    return (f'<div class="figs"><figure>{top_svg}<figcaption>Share of each reward\'s replay distance held '
            f'by the top {analysis.TOP_K} tokens of a response (mean over replays); gray: uniform '
            f'({analysis.TOP_K} / T).</figcaption></figure>'
            f'<figure>{share_bars_svg(list(groups.items()))}<figcaption>Share of each reward\'s replay '
            'distance on each part of the response; gray: the part\'s share of tokens.'
            '</figcaption></figure></div>')


def _by(row: dict) -> str:
    """A figure's label: the reward, and its relevance source where that is not the replay."""
    source = row.get("source", "replay")
    return row["reward"] if source == "replay" else f'{row["reward"]} [{source}]'


def task_section(task: str, con: duckdb.DuckDBPyConnection, data: dict[str, Any], chosen: list[str],
                 floor: float, scale: str = "reward") -> str:
    def of_task(rows: list[dict]) -> list[dict]:
        return [r for r in rows if r["task"] == task]

    details = [analysis.response_detail(con, rid) for rid in chosen]
    scales = reward_scales(details, floor) if scale == "reward" else None
    cards, anchored = [], set(chosen)  # an id anchors once: at its card, else at its first listing as a sibling
    for rid, detail in zip(chosen, details):
        others = analysis.siblings(con, rid)
        cards.append(response_card(*detail, floor=floor, scales=scales,
                                   siblings=[analysis.response_detail(con, other) for other in others],
                                   anchored_siblings={o for o in others if o not in anchored}))
        anchored.update(others)
    return (f'<section id="task-{escape(task)}"><h2>{escape(task)}</h2><h3>Rewards</h3>'
            f'{reward_table(of_task(data["summary"]), data["hist"])}'
            f'<h3>Where the replay distance falls</h3>{share_figures(of_task(data["top"]), of_task(data["parts"]))}'
            f'<h3>Responses</h3><p class="label">Token shading: green positive, red negative advantage, '
            f'intensity by magnitude on {"one scale per reward" if scale == "reward" else "one scale per response"}'
            f'; hover a token for its distance d, weight w '
            f'and advantage A.</p>{"".join(cards) or "<p>No credited responses.</p>"}</section>')


def render(con: duckdb.DuckDBPyConnection, manifest: dict[str, Any], responses_per_task: int = 2,
           ids: list[str] | None = None, floor: float = FLOOR, scale: str = "reward") -> str:
    """The report's HTML for a connection from `connect(out)` and the run's manifest: the responses
    `ids` (by task), else `responses_per_task` chosen ones per task; `scale`: one of SCALES."""
    data = {"summary": analysis.reward_summary(con).to_pylist(), "hist": analysis.score_histograms(con),
            "top": analysis.top_share(con).to_pylist(), "parts": analysis.part_share(con).to_pylist()}
    counts = analysis.rows(con, analysis.COUNTS_SQL)[0]
    chosen = analysis.responses_by_task(con, ids) if ids else analysis.chosen_responses(con, responses_per_task)
    tasks = sorted({r["task"] for r in analysis.rows(con, "SELECT DISTINCT task FROM responses")})
    nav = "".join(f'<a href="#task-{escape(t)}">{escape(t)}</a>' for t in tasks)
    sections = "".join(task_section(t, con, data, chosen.get(t, []), floor, scale) for t in tasks)
    title = escape(f'tokencredit report: {manifest.get("run_id", "")}')
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f'<style>{CSS}</style></head><body><h1>tokencredit credit report: '
            f'{escape(str(manifest.get("run_id", "")))}</h1>{failures(tasks, data)}{header(manifest, counts)}'
            f'<nav>{nav}</nav>{legend(floor, scale)}'
            f'{sections}<script>{JS}</script></body></html>')


def write_report(out: str | Path, dest: str | Path | None = None, responses_per_task: int = 2,
                 ids: list[str] | None = None, floor: float = FLOOR, allow_incomplete: bool = False,
                 scale: str = "reward") -> Path:
    """Write the HTML report of run directory `out` to `dest` (default OUT/report.html).

    ids: show these responses token by token (ValueError naming one that is not in the run);
    default: `responses_per_task` chosen per task. floor: |advantage| below it is drawn white. scale: 'reward'
    (one colour scale per reward across a task's cards) or 'card' (one per card).
    """
    if scale not in SCALES:
        raise ValueError(f"scale {scale!r}: one of {', '.join(SCALES)}")
    out = str(out)
    con = connect(out, allow_incomplete=allow_incomplete)
    run = run_files(out, allow_incomplete=True)
    html = render(con, run.manifest, responses_per_task, ids, floor, scale)
    dest_fs, path = (run.fs, f"{run.root}/report.html") if dest is None else filesystem(str(dest))
    with dest_fs.open_output_stream(path) as stream:
        stream.write(html.encode())
    return Path(path)
