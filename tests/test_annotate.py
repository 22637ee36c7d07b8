"""The annotate stage's verify step: a verifier that crashes marks its response failed, never drops it."""
import dataclasses

import verifiers
from pipeline.annotate import verify_samples
from pipeline.credit import CreditConfig, assign_credit
from pipeline.tables import responses_table
from schemas.records import Sample


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
    assert stats == {"responses": 4, "verifier_failures": 1}
    table = responses_table(annotated, shard=0).to_pylist()
    assert [row["response_id"] for row in table] == [s.response_id for s in samples]
    failed = table[2]
    assert failed["status"].startswith("verifier_error") and failed["gdpo_sum"] is None and failed["rewards"] == []
    assert all(row["gdpo_sum"] is not None for i, row in enumerate(table) if i != 2)
