"""Tree-sampled groups: leaves equal flat sampling of their prefixes, the shared prefix cache equals a
prefill, the nodes table and views, resume after a kill mid-tree, and the bad inputs refused before a model loads."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import torch

from tokencredit.flows.cli import main
from tokencredit.pipeline.annotate import run_annotation
from tokencredit.pipeline.config import AnnotateConfig, CreditConfig, SamplingConfig
from tokencredit.pipeline.dataset.query import run_query
from tokencredit.pipeline.sample import make_sampler
from tokencredit.pipeline.sample.rows import node_seed, render_prompt
from tokencredit.pipeline.sample.tree import continue_prefixes
from tokencredit.verifiers import load_tasks


@pytest.fixture(scope="module")
def sampler():
    torch.set_num_threads(2)
    sampler = make_sampler("transformers")
    sampler.progress = False
    return sampler


@pytest.fixture(scope="module")
def records():
    return load_tasks("demo", "native")[0][:4]


def by_root(samples, config):
    """{(record id, root index): the leaves of that root, in leaf order}."""
    roots = {}
    for s in samples:
        roots.setdefault((s.group_id, s.segments[0].node_id), []).append(s)
    return roots


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("branch", ["fraction:0.25", "sentence"])
def test_leaves_are_flat_samples_of_their_root_prefix_with_their_seeds(sampler, records, temperature, branch):
    config = SamplingConfig(tree=(2, 3), max_new_tokens=24, temperature=temperature, seed=5, branch=branch)
    samples = sampler.sample(records, config)
    assert len(samples) == len(records) * 6
    prompts = {r.id: render_prompt(sampler.tokenizer, r.prompt)[1] for r in records}
    branched = 0
    for (record_id, root), leaves in by_root(samples, config).items():
        cut = leaves[0].segments[0].end
        prefix = leaves[0].token_ids[:cut]
        assert all(leaf.token_ids[:cut] == prefix for leaf in leaves)  # siblings share their root's tokens
        seeds = [node_seed(config.seed, record_id, leaf.segments[1].node_id.split("/")[-1]) for leaf in leaves]
        # the root itself: flat sampling with the root's seed, cut at the branch point
        root_seed = node_seed(config.seed, record_id, root.split("/")[-1])
        flat_root = sampler.generate([prompts[record_id]], [root_seed], config)[0][0]
        assert flat_root[:cut] == prefix
        if cut == len(leaves[0].token_ids):  # the root ended before its branch point: copies of it
            assert all(leaf.token_ids == prefix and leaf.segments[1].start == leaf.segments[1].end == cut
                       for leaf in leaves)
            continue
        branched += 1
        # each continuation: flat sampling from the prompt with the root's tokens appended, with the leaf's seed
        flat = SamplingConfig(n=1, max_new_tokens=config.max_new_tokens - cut, temperature=temperature)
        tokens, logprobs = sampler.generate([prompts[record_id] + prefix] * len(leaves), seeds, flat)
        continued = continue_prefixes(sampler, [prompts[record_id]], [prefix], [seeds], config)[0]
        for leaf, t, lp, (ct, clp) in zip(leaves, tokens, logprobs, continued):
            assert leaf.token_ids[cut:] == t == ct
            # the shared cache (root decoded token by token, then copied per row) gives a prefill's logits
            assert leaf.sample_logprobs[cut:] == pytest.approx(lp, abs=1e-4)
            assert clp == pytest.approx(lp, abs=1e-4)
    assert branched >= 2, "too few roots branched to test the continuations"


def test_fraction_zero_makes_flat_leaves_and_deeper_trees_nest(sampler, records):
    flat = sampler.sample(records[:2], SamplingConfig(tree=(3, 1), branch="fraction:0", max_new_tokens=16))
    assert all(s.segments[0].start == s.segments[0].end == 0 for s in flat)
    deep = sampler.sample(records[:2], SamplingConfig(tree=(2, 2, 2), branch="fraction:0.25", max_new_tokens=16))
    assert [s.response_id for s in deep] == [f"{r.id}/{j}" for r in records[:2] for j in range(8)]
    for s in deep:
        ids = [g.node_id.split("/")[-1] for g in s.segments]
        j = int(s.response_id.split("/")[-1])
        assert ids == [f"t{j // 4}", f"t{j // 4}.{j // 2 % 2}", f"t{j // 4}.{j // 2 % 2}.{j % 2}"]
        assert [g.parent_id for g in s.segments] == [None, s.segments[0].node_id, s.segments[1].node_id]


def test_sharing_feeds_each_prefix_once(sampler, records):
    """A 2 x 4 tree decodes each root's tokens once: fewer decoded tokens than 8 flat samples of as many
    tokens would need, and the prompt is prefilled once per batch either way."""
    config = SamplingConfig(tree=(2, 4), max_new_tokens=24, branch="fraction:0.5", batch_size=64)
    before = sampler.prefilled_tokens, sampler.decoded_tokens
    samples = sampler.sample(records, config)
    prefilled, decoded = sampler.prefilled_tokens - before[0], sampler.decoded_tokens - before[1]
    prompts = sum(len(render_prompt(sampler.tokenizer, r.prompt)[1]) for r in records)
    assert prefilled == prompts
    shared = sum(s.segments[0].end for s in samples) - sum(s.segments[0].end for s in samples[::4])
    assert decoded <= sum(len(s.token_ids) for s in samples) - shared


def tree_config(**sampling) -> AnnotateConfig:
    return AnnotateConfig(limit=2, shard_size=2, credit=CreditConfig(kinds=("gdpo",)),
                          sampling=SamplingConfig(tree=(2, 3), max_new_tokens=24, seed=3, **sampling))


def test_nodes_table_and_views_describe_each_tree(tmp_path):
    out = tmp_path / "run"
    manifest = run_annotation(tree_config(), str(out), progress=False)
    groups = manifest["totals"]["responses"] // 6
    assert manifest["totals"]["responses"] == groups * 6 and groups >= 3
    rows = run_query(out, "select response_id, group_id, token_ids, segments from responses").fetchall()
    nodes = {n[0]: n for n in run_query(out, "select node_id, parent_id, group_id, depth, start, \"end\", "
                                             "prefix_tokens, leaves from nodes").fetchall()}
    assert len(nodes) == manifest["totals"]["nodes"] == groups * (2 + 2 * 3)  # node ids unique
    per_group = {}
    for response_id, group_id, token_ids, segments in rows:
        per_group[group_id] = per_group.get(group_id, 0) + 1
        assert segments[0]["start"] == 0 and segments[-1]["end"] == len(token_ids)
        assert all(a["end"] == b["start"] for a, b in zip(segments, segments[1:]))  # contiguous
        assert [g["parent_id"] for g in segments] == [None, segments[0]["node_id"]]
        for depth, g in enumerate(segments):
            node = nodes[g["node_id"]]
            assert node[1:6] == (g["parent_id"], group_id, depth, g["start"], g["end"])
    assert set(per_group.values()) == {6}
    for node_id, parent_id, *_, leaves in nodes.values():
        assert leaves == (3 if parent_id is None else 1)
        assert parent_id is None or parent_id in nodes
    joined = run_query(out, "select count(*), count(distinct response_id) from leaf_segments").fetchall()[0]
    assert joined == (len(rows) * 2, len(rows))
    flat = run_annotation(AnnotateConfig(limit=1, credit=CreditConfig(kinds=("gdpo",)),
                                         sampling=SamplingConfig(max_new_tokens=8)), str(tmp_path / "flat"),
                          progress=False)
    assert flat["totals"]["nodes"] == 0
    assert run_query(tmp_path / "flat", "select count(*) from responses where segments is null").fetchall()[0][0] == \
        flat["totals"]["responses"]


def test_a_resume_with_another_tree_is_refused(tmp_path):
    run_annotation(AnnotateConfig(limit=1, credit=CreditConfig(kinds=("gdpo",)), sampling=SamplingConfig(
        tree=(2, 2), max_new_tokens=8)), str(tmp_path), progress=False)
    for other in ({"tree": (2, 3)}, {"tree": (2, 2), "branch": "sentence"}):
        config = AnnotateConfig(limit=1, credit=CreditConfig(kinds=("gdpo",)),
                                sampling=SamplingConfig(max_new_tokens=8, **other))
        with pytest.raises(ValueError, match="another config"):
            run_annotation(config, str(tmp_path), progress=False)


@pytest.mark.slow
def test_a_run_killed_mid_tree_resumes_without_duplicated_or_missing_leaves(tmp_path):
    out = tmp_path / "killed"
    args = ["annotate", "--out", str(out), "--limit", "2", "--shard-size", "1", "--tree", "2,2",
            "--max-new-tokens", "24", "--seed", "7", "--credit", "gdpo", "--runner", "none",
            "--verifier-timeout", "120"]
    proc = subprocess.Popen([sys.executable, "-m", "tokencredit.flows.cli", *args], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while not list((out / "_shards").glob("*.json")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    written = len(list((out / "_shards").glob("*.json")))
    assert 1 <= written < 6, f"the kill should land mid-run ({written} of 6 shards written)"
    assert main(args) == 0
    full = tmp_path / "uninterrupted"
    assert main([*args[:2], str(full), *args[3:]]) == 0
    for table, key in (("responses", "response_id"), ("nodes", "node_id")):
        resumed = sorted(ds.dataset(out / table).to_table().to_pylist(), key=lambda r: r[key])
        ids = [r[key] for r in resumed]
        assert len(ids) == len(set(ids)) == (6 * 4 if table == "responses" else 6 * (2 + 4))
        assert resumed == sorted(ds.dataset(full / table).to_table().to_pylist(), key=lambda r: r[key])


@pytest.mark.parametrize("extra, says", [
    (["--tree", "0,4"], "--tree: expected R,L"),
    (["--tree", "4"], "--tree: expected R,L"),
    (["--tree", "4,4", "--branch", "fraction:1.5"], "--branch: branch 'fraction:1.5'"),
    (["--tree", "2,2,2", "--branch", "fraction:0.5", "--max-new-tokens", "8"], "not before max_new_tokens=8"),
    (["--tree", "4,4", "--n", "8"], "n=8 conflicts with tree=(4, 4)"),
])
def test_bad_tree_options_are_one_clear_error_before_any_model_loads(tmp_path, capsys, extra, says):
    try:
        code = main(["annotate", "--out", str(tmp_path / "run"), "--runner", "none", *extra])
    except SystemExit as exit_:  # argparse's own refusal
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) <= 3
    assert not (tmp_path / "run").exists()  # refused before the run started


def test_mc_credit_without_a_tree_is_refused():
    with pytest.raises(ValueError, match="mc needs tree-sampled groups"):
        AnnotateConfig(credit=CreditConfig(kinds=("gdpo", "mc")))
    AnnotateConfig(credit=CreditConfig(kinds=("gdpo", "mc")), sampling=SamplingConfig(tree=(2, 2)))


@pytest.mark.real
def test_smollm2_leaves_continue_their_root_as_flat_sampling_does(records):
    from tokencredit.pipeline.models.registry import MODELS, home  # noqa: F401

    try:
        smol = make_sampler("transformers", "smollm2-135m-instruct")
    except (OSError, ValueError) as error:
        pytest.skip(f"SmolLM2 is not pulled ({error})")
    smol.progress = False
    config = SamplingConfig(tree=(1, 2), max_new_tokens=12, branch="fraction:0.5", seed=1)
    leaves = smol.sample(records[:1], config)
    prompt = render_prompt(smol.tokenizer, records[0].prompt)[1]
    cut = leaves[0].segments[0].end
    seeds = [node_seed(1, records[0].id, f"t0.{l}") for l in range(2)]
    continued = continue_prefixes(smol, [prompt], [leaves[0].token_ids[:cut]], [seeds], config)[0]
    assert [leaf.token_ids[cut:] for leaf in leaves] == [tokens for tokens, _ in continued]
