"""bench/bench_localization_own.py's position priors: the first-token rule and a linearly decreasing weight on the
same pairs as each credit, the paired bootstrap of credit minus the first-token rule, the verdict against the
stronger null, and the keys in the stored rows.

Run in child processes: importing bench/common sets torch's thread count for the whole process."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KEYS = ("prior_first_token", "prior_linear", "minus_prior_first", "minus_prior_first_ci_low",
        "minus_prior_first_ci_high")


def in_child(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", f"import sys, json; sys.path.insert(0, {str(ROOT / 'bench')!r})\n"
                           f"from bench_localization_own import *\n{code}"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_priors_of_a_pair():
    out = in_child("""
pairs = [{"start": 0, "end": 2, "length": 4}, {"start": 2, "end": 4, "length": 4}, {"start": 1, "end": 2, "length": 1000}]
print(json.dumps([priors_of(p) for p in pairs]))""")
    # weights T - t: 4, 3, 2, 1 (sum 10); [0, 2) holds 7, [2, 4) holds 3
    assert out[0] == [1.0, 0.7]
    assert out[1] == [0.0, pytest.approx(0.3)]
    assert out[2][0] == 0.0 and out[2][1] == pytest.approx(999 / (1000 * 1001 / 2))


def test_credit_minus_the_first_token_rule_is_paired():
    out = in_child("""
pairs = [{"start": 0, "end": 2, "length": 4}, {"start": 2, "end": 4, "length": 4}, {"start": 0, "end": 1, "length": 8},
         {"start": 3, "end": 5, "length": 8}]
same = prior_keys(pairs, [0, 1, 2, 3], [1.0, 0.0, 1.0, 0.0], 500, 0)   # hits exactly where the rule hits
better = prior_keys(pairs, [0, 1, 2, 3], [1.0, 1.0, 1.0, 1.0], 500, 0)
print(json.dumps({"same": same, "better": better}))""")
    same, better = out["same"], out["better"]
    assert set(KEYS) <= set(same)
    assert same["prior_first_token"] == 0.5
    # paired: a credit that agrees with the rule on every pair differs by exactly 0, interval included
    assert same["minus_prior_first"] == same["minus_prior_first_ci_low"] == same["minus_prior_first_ci_high"] == 0
    assert better["minus_prior_first"] == 0.5 and 0 <= better["minus_prior_first_ci_low"] <= 0.5


def test_every_row_is_the_mean_of_the_kept_pair_records():
    out = in_child("""
pairs = [{"response_id": f"r{i}", "reward": "c", "constraint_index": 0, "start": s, "end": e, "length": 6}
         for i, (s, e) in enumerate([(0, 2), (2, 4), (0, 1), (3, 6), (1, 2)])]
credit = {(p["response_id"], "c", 0): [0.0] * 6 for p in pairs}
for (r, _, _), adv, t in zip(credit, credit.values(), [1, 3, 4, 5, 1]):
    adv[t] = -1.0
credits = {("mrtpo", "replay"): credit, ("gdpo", "uniform"): None, ("first_token", "-"): first_token_credit(pairs)}
rows = rows_for("m", pairs, credits, 4, 200, 0)
print(json.dumps({"rows": rows, "records": pair_records("flat", pairs, credits)}))""")
    rows = {(r["credit"], r["locate"]): r for r in out["rows"] if r["kind"] == "all"}
    records = out["records"]
    assert [r["start"] for r in records] == [0, 2, 0, 3, 1] and {r["pool"] for r in records} == {"flat"}
    for (credit, locate), row in rows.items():
        top = [r["credits"][f"{credit}/{locate}"]["top_in"] for r in records]
        mass = [r["credits"][f"{credit}/{locate}"]["mass_in"] for r in records]
        assert row["top_in_decisive"] == pytest.approx(sum(top) / 5)
        assert row["mass_in_decisive"] == pytest.approx(sum(mass) / 5)
        first = [float(r["start"] == 0) for r in records]
        assert row["minus_prior_first"] == pytest.approx(sum(t - f for t, f in zip(top, first)) / 5)
    assert rows[("mrtpo", "replay")]["top_in_decisive"] == pytest.approx(4 / 5)  # all but the third (4 not in [0, 1))
    assert rows[("first_token", "-")]["top_in_decisive"] == pytest.approx(2 / 5)
    assert all(row["stronger_null"] == "first_token" for row in rows.values())  # 2 of 5 start at token 0
    assert rows[("mrtpo", "replay")]["met"] is False  # 0.8 is short of 2 x 0.4


def test_met_is_judged_against_the_stronger_null():
    out = in_child("""
p2t = {"top_in_decisive": 0.224, "chance": 0.108, "ci_low": 0.169, "prior_first_token": 0.383, "prior_linear": 0.2,
       "minus_prior_first": -0.159, "minus_prior_first_ci_low": -0.23}
late = {"top_in_decisive": 0.5, "chance": 0.1, "ci_low": 0.4, "prior_first_token": 0.05, "prior_linear": 0.2,
        "minus_prior_first": 0.45, "minus_prior_first_ci_low": 0.3}
print(json.dumps([stronger_null(p2t), met_against_stronger_null(p2t), stronger_null(late),
                  met_against_stronger_null(late), met_against_stronger_null({**late, "top_in_decisive": 0.35}),
                  verdict_keys(late)]))""")
    assert out[0] == ["first_token", 0.383] and out[1] is False  # 2x chance, but below the first-token rule
    assert out[2] == ["linear", 0.2] and out[3] is True
    assert out[4] is False  # under 2x the linear prior
    assert out[5] == {"stronger_null": "linear", "stronger_null_value": 0.2, "met": True}  # the keys the docs render


def met_against(row: dict) -> bool:
    """The target, written again apart from the benchmark's code: at least 2x the strongest of the three nulls, and
    the interval excluding it (the paired interval of the difference where the first-token rule is the strongest)."""
    null = max(row["chance"], row["prior_first_token"], row["prior_linear"])
    excluded = row["minus_prior_first_ci_low"] > 0 if null == row["prior_first_token"] else row["ci_low"] > null
    return row["top_in_decisive"] >= 2 * null and excluded


def test_every_own_sample_row_carries_the_prior_keys():
    rows = json.loads((ROOT / "bench" / "results" / "localization_own.json").read_text())
    first = {(r["pool"], r["kind"]): r["top_in_decisive"] for r in rows if r["credit"] == "first_token"}
    for row in rows:
        assert set(KEYS) <= set(row), (row["credit"], row["kind"])
        assert row["prior_first_token"] == first[(row["pool"], row["kind"])]
        assert row["minus_prior_first"] == pytest.approx(row["top_in_decisive"] - row["prior_first_token"])
        assert None not in (row["prior_linear"], row["minus_prior_first_ci_low"], row["minus_prior_first_ci_high"])
        assert row["met"] == met_against(row)
    credits = [r for r in rows if r["kind"] == "all" and r["credit"] not in ("gdpo", "first_token")]
    assert {r["credit"] for r in credits} == {"mrtpo", "p2t", "mc"}
    assert not any(r["met"] for r in credits)  # the claim the docs make: no credit meets its target


@pytest.mark.slow
def test_the_quick_run_reports_each_credit_against_the_priors():
    """The benchmark end to end on the tiny policy (a few demo prompts; writes nothing): every credit's line gives
    the first-token rule, the paired difference with its interval, and the linear prior."""
    done = subprocess.run([sys.executable, "-m", "bench", "localization_own", "--quick"], capture_output=True,
                          text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if "top in decisive" in line]
    assert {line.split(":")[0] for line in lines} >= {"mrtpo/replay", "gdpo/uniform", "first_token/-"}
    for line in lines:
        assert "first-token rule" in line and "credit minus it" in line and "linear prior" in line, line
    first = next(line for line in lines if line.startswith("first_token/-"))
    assert "credit minus it +0.000 [+0.000, +0.000]" in first
