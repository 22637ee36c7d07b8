"""Progress of sampling, replay and P2T: log lines with tokens/s without a terminal, a bar on one."""
from __future__ import annotations

import io
import os
import re
import select
import time

from tokencredit import verifiers
from tokencredit.pipeline.annotate import annotate_shard, load_models
from tokencredit.pipeline.config import AnnotateConfig, CreditConfig, SamplingConfig
from tokencredit.pipeline.progress import Progress
from tokencredit.pipeline.credit.replay import ReplayItem, ReplayStats, replay_distances

LINE = re.compile(r"^(sampling|replay|p2t): ([\d,]+)/([\d,]+) (responses|tokens)(, ([\d,]+) tokens)?, "
                  r"([\d,]+) tokens/s, \d+ s$")


def test_each_long_stage_logs_its_progress_with_tokens_per_second(capsys):
    config = AnnotateConfig(sampling=SamplingConfig(n=4, max_new_tokens=24, seed=4),
                            credit=CreditConfig(kinds=("gdpo", "mrtpo", "p2t"), locate="replay"))
    demo = verifiers.load_tasks("demo")[0]
    records = [next(r for r in demo if r.task == task) for task in ("sql", "tools")]
    capsys.readouterr()
    tables, stats = annotate_shard(records, 0, config, load_models(config))
    lines = {m.group(1): m for m in map(LINE.match, capsys.readouterr().err.splitlines()) if m}
    assert set(lines) == {"sampling", "replay", "p2t"}
    responses = tables["responses"].num_rows
    sampled = sum(map(len, tables["responses"]["token_ids"].to_pylist()))
    assert lines["sampling"].group(2) == lines["sampling"].group(3) == str(responses)
    assert int(lines["sampling"].group(6).replace(",", "")) == sampled
    assert stats["tokens_replayed"] > 0  # seed 4: some groups have variance, so the replay runs
    assert int(lines["replay"].group(2).replace(",", "")) == stats["tokens_replayed"]  # every replayed token
    assert lines["p2t"].group(2) == str(responses) and int(lines["p2t"].group(6).replace(",", "")) == sampled
    assert all(int(m.group(7).replace(",", "")) > 0 for m in lines.values())


def test_replay_reports_every_replayed_token(tiny_causal_lm):
    items = [ReplayItem([1, 5, 6, 7], [[1, 5, 7], None, [1, 6, 7]], [9, 10, 11]),
             ReplayItem([1, 5, 8], [None, None], [12, 13]),
             ReplayItem([1, 4, 4, 4], [[1, 4]], [20, 21, 22, 23])]
    seen, stats = [], ReplayStats()
    replay_distances(tiny_causal_lm, items, batch_size=2, stats=stats, on_progress=seen.append)
    assert sum(seen) == stats.tokens_replayed == 2 * 3 + 4 and len(seen) >= 1


def test_without_a_terminal_a_line_at_most_every_few_seconds_and_at_the_end_never_twice():
    often, rarely = io.StringIO(), io.StringIO()
    for stream, every in ((often, 0.0), (rarely, 3600.0)):
        with Progress("replay", total=40, unit="token", stream=stream, every=every) as progress:
            for _ in range(4):
                progress.update(10)
    assert [line.split(",")[0] for line in often.getvalue().splitlines()] == [
        "replay: 10/40 tokens", "replay: 20/40 tokens", "replay: 30/40 tokens", "replay: 40/40 tokens"]
    assert [line.split(",")[0] for line in rarely.getvalue().splitlines()] == ["replay: 40/40 tokens"]
    assert "tokens/s" in rarely.getvalue()


def read_until(fd: int, done, seconds: float = 60.0) -> str:
    """What the terminal shows once `done(text)` holds, the writer closed it, or `seconds` passed:
    on a loaded machine the final redraw may arrive after the first read."""
    text, deadline = "", time.monotonic() + seconds
    while not done(text) and select.select([fd], [], [], max(deadline - time.monotonic(), 0))[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other side is closed and everything it wrote has been read
            break
        if not chunk:
            break
        text += chunk.decode(errors="replace")
    return text


def test_on_a_terminal_a_bar():
    primary, secondary = os.openpty()
    with os.fdopen(secondary, "w") as tty:
        with Progress("sampling", total=4, unit="response", stream=tty) as progress:
            progress.update(2, tokens=50)
            progress.update(2, tokens=30)
        tty.flush()
        drawn = read_until(primary, lambda text: "4/4" in text and "tokens/s" in text.rpartition("4/4")[2])
    os.close(primary)
    assert "sampling" in drawn and "4/4" in drawn and "tokens/s" in drawn
