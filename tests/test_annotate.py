"""The annotate stage's verify step: a verifier that crashes marks its response failed, never drops it."""
import dataclasses

from tokencredit import verifiers
from tokencredit.pipeline.annotate import verify_samples
from tokencredit.pipeline.credit.assign import CreditConfig, assign_credit
from tokencredit.pipeline.dataset.tables import responses_table
from tokencredit.schemas.records import Sample


def sample(record, j: int, response: str) -> Sample:
    return Sample(response_id=f"{record.id}/{j}", group_id=record.id, task=record.task, prompt=record.prompt,
                  prompt_token_ids=[1, 2], response=response, token_ids=[3, 4, 5], sample_logprobs=[-0.1] * 3,
                  model="hand-made", seed=0)


def test_a_crashing_verifier_keeps_the_row_with_a_failed_status():
    good = next(r for r in verifiers.load_tasks("demo")[0] if r.task == "sql")
    # A reference query that no longer runs (say, the database changed): the SQL verifier raises
    # RecordError for it, but only once a response's own query has run.
    broken = dataclasses.replace(good, id="broken", spec=dataclasses.replace(good.spec, reference_sql="SELECT x FROM nowhere"))
    samples = [sample(good, 0, good.reference_response), sample(good, 1, "no sql here"),
               sample(broken, 0, "<sql>SELECT 1</sql>"), sample(broken, 1, "no sql here")]
    verified = verify_samples(samples, {good.id: good, broken.id: broken})
    assert [v.status.split(":")[0] for v in verified] == ["ok", "ok", "verifier_error", "ok"]
    assert "'reference_sql'" in verified[2].status and "broken" in verified[2].status

    annotated, stats = assign_credit(verified, {good.id: good, broken.id: broken}, CreditConfig(kinds=("gdpo",)))
    seconds = stats.pop("seconds")  # each credit method's wall time (pipeline.timing)
    assert stats == {"responses": 4, "verifier_failures": 1} and set(seconds) == {"credit_gdpo", "credit_rows"}
    table = responses_table(annotated, shard=0).to_pylist()
    assert [row["response_id"] for row in table] == [s.response_id for s in samples]
    failed = table[2]
    assert failed["status"].startswith("verifier_error") and failed["gdpo_sum"] is None and failed["rewards"] == []
    assert all(row["gdpo_sum"] is not None for i, row in enumerate(table) if i != 2)


# --- checked at load: prompt length, nothing to annotate --------------------------------------------
import json  # noqa: E402

from tokencredit.pipeline.annotate import AnnotateConfig, load_prompt_set  # noqa: E402
from tokencredit.flows.cli import main  # noqa: E402
from tests.test_progress import without_phases  # noqa: E402


def write_prompts(path, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def title_record(record_id: str, prompt: str) -> dict:
    return {"id": record_id, "task": "instructions", "prompt": prompt, "constraints": [{"kind": "title", "args": {}}]}


def test_a_prompt_longer_than_the_models_context_is_rejected_at_load(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", [title_record("short", "Write a title."),
                                                    title_record("long", "word " * 600),
                                                    title_record("huge", "x" * 1_000_000)])
    records, rejected = load_prompt_set(AnnotateConfig(prompts=prompts, limit=None))
    assert [r.id for r in records] == ["short"]
    assert [(r.record_id, r.line_no, r.field) for r in rejected] == [("long", 2, "prompt"), ("huge", 3, "prompt")]
    assert "the model's context is 512 tokens" in rejected[0].reason and "cannot fit" in rejected[1].reason


def test_nothing_to_annotate_exits_2_with_one_line(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert main(["annotate", "--out", str(tmp_path / "a"), "--prompts", str(empty), "--runner", "none"]) == 2
    assert len(without_phases(capsys.readouterr().err)) == 1
    bad = write_prompts(tmp_path / "bad.jsonl", [title_record("rhyme", "Rhyme.") | {"constraints": [{"kind": "rhyme", "args": {}}]}])
    assert main(["annotate", "--out", str(tmp_path / "b"), "--prompts", bad, "--runner", "none"]) == 2
    reasons, error = without_phases(capsys.readouterr().err)[1:]  # the reasons first, then the one error line
    assert reasons.startswith("  bad.jsonl line 1, field 'constraints[0].kind': unknown constraint kind")
    assert error.startswith("tokencredit annotate: error:") and "1 rejected" in error and "rejected.jsonl" in error
    assert json.loads((tmp_path / "b" / "rejected.jsonl").read_text())["field"] == "constraints[0].kind"
    assert main(["annotate", "--out", str(tmp_path / "c"), "--prompts", "demo", "--tasks", "poems", "--runner", "none"]) == 2
    assert "no record of tasks poems" in capsys.readouterr().err
