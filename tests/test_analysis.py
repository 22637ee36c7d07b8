"""Figure 6 queries of pipeline.analysis against a plain-Python computation over the same Parquet."""
import json
from collections import defaultdict

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tokencredit.pipeline.dataset import analysis
from tokencredit.pipeline.dataset.query import connect
from tokencredit.pipeline.dataset.writer import RunWriter


def _tables(out):
    return {name: pq.read_table(sorted((out / name).glob("part-*.parquet"))) for name in ("responses", "credits")}


def _with_zero_replay(src, dest):
    """A copy of run `src` in which one replayed (response, reward) pair has all-zero distances."""
    tables = _tables(src)
    credits = tables["credits"]
    first = credits.filter(pc.is_valid(credits["distance"])).slice(0, 1).to_pylist()[0]
    pair = pc.and_(pc.equal(credits["response_id"], first["response_id"]), pc.equal(credits["reward"], first["reward"]))
    distance = pc.if_else(pair, pa.scalar(0.0, pa.float32()), credits["distance"])
    tables["credits"] = credits.set_column(credits.schema.get_field_index("distance"), "distance", distance)
    writer = RunWriter(str(dest))
    writer.start("zeroed", {"from": str(src)}, "zeroed", "test")
    writer.write_shard(0, tables, {})
    writer.finish(1, {})
    return dest


@pytest.fixture(scope="module", params=["short", "long"])
def run(request, tmp_path_factory):
    """short: T in [1, 3] (uniform baseline capped at 1); long: T in [8, 24]; both with one zeroed replay."""
    tmp = tmp_path_factory.mktemp(request.param)
    tokens = {"short": 2, "long": 16}[request.param]
    src = analysis.synthetic_run(tmp / "src", responses=60, tokens=tokens, rewards=3, seed=7, shard_responses=24)
    return _with_zero_replay(src, tmp / "run")


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
    return analysis.synthetic_run(tmp_path_factory.mktemp("plain") / "run", responses=48, tokens=16, rewards=3, seed=1)


def replays(out):
    """(task, response_id, reward, constraint_index) -> [(distance, part)] of replays with a positive
    total distance."""
    by_pair = defaultdict(list)
    for row in _tables(out)["credits"].to_pylist():
        if row["distance"] is not None:
            key = row["task"], row["response_id"], row["reward"], row["constraint_index"]
            by_pair[key].append((row["distance"], row["part"]))
    return {key: tokens for key, tokens in by_pair.items() if sum(d for d, _ in tokens) > 0}


def brute_top_share(out):
    sums = defaultdict(lambda: [0, 0.0, 0.0])
    for (task, _, reward, _), tokens in replays(out).items():
        d = sorted((d for d, _ in tokens), reverse=True)
        acc = sums[task, reward]
        acc[0] += 1
        acc[1] += sum(d[:3]) / sum(d)
        acc[2] += min(1.0, 3 / len(d))
    return {key: (n, top / n, uniform / n) for key, (n, top, uniform) in sums.items()}


def brute_part_share(out):
    shares = defaultdict(lambda: [0.0, 0.0])
    counts = defaultdict(int)
    for (task, _, reward, _), tokens in replays(out).items():
        counts[task, reward] += 1
        total = sum(d for d, _ in tokens)
        for d, part in tokens:
            acc = shares[task, reward, part]
            acc[0] += d / total
            acc[1] += 1 / len(tokens)
    return {(t, r, p): (counts[t, r], d / counts[t, r], n / counts[t, r]) for (t, r, p), (d, n) in shares.items()}


def test_top_share_matches_brute_force(run):
    got = {(r["task"], r["reward"]): (r["replays"], r["top_share"], r["uniform_share"])
           for r in analysis.top_share(connect(run)).to_pylist()}
    want = brute_top_share(run)
    assert got.keys() == want.keys()
    for key, (n, top, uniform) in want.items():
        assert got[key][0] == n, key
        assert got[key][1:] == pytest.approx((top, uniform), abs=1e-6), key


def test_part_share_matches_brute_force(run):
    got = {(r["task"], r["reward"], r["part"]): (r["replays"], r["distance_share"], r["token_share"])
           for r in analysis.part_share(connect(run)).to_pylist()}
    want = brute_part_share(run)
    assert got.keys() == want.keys()
    for key, (n, d, t) in want.items():
        assert got[key][0] == n, key
        assert got[key][1:] == pytest.approx((d, t), abs=1e-6), key


def test_shares_are_shares(run):
    con = connect(run)
    for row in analysis.top_share(con).to_pylist():
        assert 0 <= row["uniform_share"] <= row["top_share"] + 1e-12 <= 1 + 1e-9, row  # top-3 mean >= mean
    sums = defaultdict(lambda: [0.0, 0.0])
    for row in analysis.part_share(con).to_pylist():
        assert 0 <= row["distance_share"] <= 1 and 0 < row["token_share"] <= 1, row
        sums[row["task"], row["reward"]][0] += row["distance_share"]
        sums[row["task"], row["reward"]][1] += row["token_share"]
    assert sums and all(s == pytest.approx([1, 1], abs=1e-9) for s in sums.values())


def test_zeroed_replay_is_left_out(run):
    n = sum(r["replays"] for r in analysis.top_share(connect(run)).to_pylist())
    replayed = json.loads((run.parent / "src" / "manifest.json").read_text())["stats"]["replays_done"]
    assert n == replayed - 1


def test_short_responses_cap_the_uniform_baseline(run):
    rows = analysis.top_share(connect(run)).to_pylist()
    if run.parent.name.startswith("short"):  # every T <= 3: the top 3 hold everything
        assert all(r["uniform_share"] == 1 and r["top_share"] == pytest.approx(1) for r in rows)
    else:
        assert all(r["uniform_share"] < 0.4 for r in rows)


def test_synthetic_distances_are_concentrated(long_run):
    con = connect(long_run)
    for row in analysis.top_share(con).to_pylist():
        assert row["top_share"] > row["uniform_share"] + 0.4, row
    tags = [r for r in analysis.part_share(con).to_pylist() if r["task"] == "sql" and r["part"] == "tags"]
    format_tags = next(r for r in tags if r["reward"] == "format")
    assert format_tags["distance_share"] > 0.5 > 3 * format_tags["token_share"]


def test_instruction_rewards_are_grouped_by_kind(long_run):
    con = connect(long_run)
    kinds = {r["reward"] for r in analysis.top_share(con).to_pylist() if r["task"] == "instructions"}
    assert kinds == {"keyword_include", "length_words"}
    stored = analysis.rows(con, "SELECT DISTINCT reward, constraint_index FROM credits WHERE task = 'instructions'")
    assert {(r["reward"], r["constraint_index"]) for r in stored} == {
        ("keyword_include", 0), ("length_words", 1), ("keyword_include", 2)}
    others = analysis.rows(con, "SELECT count(*) AS n FROM credits WHERE task != 'instructions' "
                                "AND constraint_index IS NOT NULL")
    assert others == [{"n": 0}]


def test_no_mrtpo_gives_empty_shares(tmp_path):
    con = connect(analysis.synthetic_run(tmp_path / "run", responses=12, tokens=6, rewards=2, mrtpo=False))
    assert analysis.top_share(con).num_rows == 0 and analysis.part_share(con).num_rows == 0
    assert analysis.rows(con, analysis.COUNTS_SQL)[0]["replayed_rows"] == 0


def test_histograms_count_every_score(long_run):
    con = connect(long_run)
    hist = analysis.score_histograms(con)
    summary = analysis.reward_summary(con).to_pylist()
    assert {(r["task"], r["reward"]): r["responses"] for r in summary} == {k: sum(v) for k, v in hist.items()}
    # binary scores: only the first and the last bin
    assert all(v[1:9] == [0] * 8 for v in hist.values())


def test_chosen_responses_are_deterministic_and_mixed(long_run):
    con = connect(long_run)
    chosen = analysis.chosen_responses(con, 2)
    assert chosen == analysis.chosen_responses(connect(long_run), 2)
    assert set(chosen) == {"sql", "instructions", "tools"} and all(len(ids) == 2 for ids in chosen.values())
    for task, ids in chosen.items():
        groups = set()
        for rid in ids:
            response, per_reward = analysis.response_detail(con, rid)
            assert response["task"] == task and min(response["rewards"]) < max(response["rewards"])
            assert len(per_reward) == len(response["reward_names"])
            for name, credits in zip(response["reward_names"], per_reward):
                assert credits and {c["reward"] for c in credits} == {name}
                assert [c["position"] for c in credits] == list(range(len(per_reward[0])))
            groups.add(response["group_id"])
        assert len(groups) == len(ids)  # spread over prompts
    with pytest.raises(KeyError, match="r-missing"):
        analysis.response_detail(con, "r-missing")
