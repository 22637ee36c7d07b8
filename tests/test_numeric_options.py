"""Numeric options are refused where they are parsed (issue 39, item 7): NaN, infinities, overflow, negatives,
and a --tree whose one tree cannot fit in memory, each as one line naming the option, before anything runs."""
import json
import os

import pytest

from tokencredit.flows.cli import CPU_THREADS_MAX, main
from tokencredit.pipeline.config import AnnotateConfig
from tests.test_progress import without_phases


def refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = "\n".join(without_phases(capsys.readouterr().err))
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("argv, option", [
    (["train", "--data", "RUN", "--out", "CKPT", "--advantage", "mrtpo:nan"], "--advantage"),
    (["train", "--data", "RUN", "--out", "CKPT", "--advantage", "gdpo:1e400"], "--advantage"),
    (["export", "RUN", "--advantage", "mrtpo:0.5,gdpo:inf"], "--advantage"),
    (["annotate", "--out", "OUT", "--verifier-memory", "1e400GB"], "--verifier-memory"),
    (["annotate", "--out", "OUT", "--verifier-memory", "-1GB"], "--verifier-memory"),
    (["annotate", "--out", "OUT", "--verifier-memory", "0"], "--verifier-memory"),
    (["annotate", "--out", "OUT", "--verifier-timeout", "nan"], "--verifier-timeout"),
    (["annotate", "--out", "OUT", "--verifier-timeout", "inf"], "--verifier-timeout"),
    (["annotate", "--out", "OUT", "--verifier-timeout", "-3"], "--verifier-timeout"),
    (["annotate", "--out", "OUT", "--seed", "-1"], "--seed"),
    (["annotate", "--out", "OUT", "--seed", str(2**64)], "--seed"),
    (["train", "--data", "RUN", "--out", "CKPT", "--seed", "-5"], "--seed"),
    (["values", "RUN", "--out", "V", "--seed", "1e3"], "--seed"),
    (["query", "RUN", "SELECT 1", "--max-rows", "-1"], "--max-rows"),
    (["query", "RUN", "SELECT 1", "--max-rows", "0"], "--max-rows"),
    (["annotate", "--out", "OUT", "--temperature", "nan"], "--temperature"),
    (["train", "--data", "RUN", "--out", "CKPT", "--lr", "inf"], "--lr"),
    # issue 49: a learning rate that turns every weight NaN, and mix weights whose sum overflows float32
    (["train", "--data", "RUN", "--out", "CKPT", "--lr", "1e30"], "--lr"),
    (["train", "--data", "RUN", "--out", "CKPT", "--lr", "0"], "--lr"),
    (["rm", "train", "RUN", "--out", "RM", "--layer-lr", "5"], "--layer-lr"),
    (["export", "RUN", "--advantage", "gdpo:3.4e38,mrtpo:3.4e38"], "--advantage"),
    (["train", "--data", "RUN", "--out", "CKPT", "--advantage", "mrtpo:2e6"], "--advantage"),
])
def test_a_bad_number_is_one_line_naming_its_option(argv, option, capsys):
    err = refused(argv, capsys)
    assert f"argument {option}:" in err


@pytest.mark.parametrize("command", [["annotate"], ["serve", "--every", "1h"]])
@pytest.mark.parametrize("threads", ["100000", "0", str(CPU_THREADS_MAX + 1)])
def test_cpu_threads_are_bounded_at_the_machines_cores(command, threads, capsys):
    """`annotate --cpu-threads 100000` segfaulted (exit 139, no message) when torch took that many threads."""
    err = refused([*command, "--out", "OUT", "--cpu-threads", threads], capsys)
    assert f"argument --cpu-threads: expected an integer from 1 to {CPU_THREADS_MAX}, got '{threads}'" in err
    assert CPU_THREADS_MAX == max(os.cpu_count(), AnnotateConfig.cpu_threads)  # the default is never refused


def test_a_negative_mix_weight_is_a_choice_and_parses():
    from tokencredit.pipeline.dataset.training import parse_advantage

    assert parse_advantage("mrtpo:2,gdpo:-1") == {"mrtpo": 2.0, "gdpo": -1.0}


def test_a_tree_too_large_for_memory_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    from tokencredit.pipeline.config import SamplingConfig
    from tokencredit.pipeline.sample import tree

    monkeypatch.setenv("TOKENCREDIT_HOME", str(tmp_path / "home"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "task": "instructions", "prompt": "Title?",
                                   "constraints": [{"kind": "title", "args": {}}]}) + "\n")
    out = tmp_path / "run"
    assert main(["annotate", "--out", str(out), "--prompts", str(prompts), "--runner", "none", "--credit", "gdpo",
                 "--tree", "3000,3000", "--max-new-tokens", "64"]) == 2
    err = "\n".join(without_phases(capsys.readouterr().err))
    assert len(err.splitlines()) == 1 and "--tree 3000,3000" in err and "GB" in err, err
    assert not (out / "manifest.json").exists()
    # the estimate grows with the leaves and the response length, and a small tree fits
    policy = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576,
              "vocab_size": 49152}
    small, long = SamplingConfig(tree=(4, 4), max_new_tokens=64), SamplingConfig(tree=(4, 4), max_new_tokens=640)
    assert tree.tree_bytes(long, policy) > 5 * tree.tree_bytes(small, policy)
    assert tree.tree_bytes(SamplingConfig(tree=(8, 4), max_new_tokens=64), policy) == 2 * tree.tree_bytes(small, policy)
    tree.check_tree_fits(small, policy, "cpu")
