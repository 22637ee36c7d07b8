"""The Arrow tables as stored: clean reward names with a constraint index, readable token text."""
from __future__ import annotations

from tokencredit import verifiers
from tokencredit.pipeline.annotate import verify_samples
from tokencredit.pipeline.credit.assign import CreditConfig, assign_credit
from tokencredit.pipeline.models.loading import load_tokenizer
from tokencredit.pipeline.dataset.tables import credits_table, responses_table
from tokencredit.schemas.records import Constraint, InstructionSpec, Sample, TaskRecord


def sample(record: TaskRecord, j: int, response: str, tokenizer) -> Sample:
    ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return Sample(response_id=f"{record.id}/{j}", group_id=record.id, task=record.task, prompt=record.prompt,
                  prompt_token_ids=[1, 2], response=tokenizer.decode(ids, skip_special_tokens=True), token_ids=ids,
                  sample_logprobs=[-0.5] * len(ids), model="tiny", seed=0)


def test_instruction_rewards_are_stored_as_kind_and_index_with_readable_tokens():
    tokenizer = load_tokenizer()
    record = TaskRecord("twice", "instructions", "Write about a river and a stone.", "river stone", InstructionSpec((
        Constraint("keyword_include", {"keywords": ["river"]}), Constraint("lowercase", {}),
        Constraint("keyword_include", {"keywords": ["stone"]}))))
    sql = next(r for r in verifiers.load_tasks("demo")[0] if r.task == "sql")
    records = {record.id: record, sql.id: sql}
    samples = [sample(record, 0, "the river ran by", tokenizer), sample(record, 1, "A Stone age", tokenizer),
               sample(sql, 0, sql.reference_response, tokenizer), sample(sql, 1, "no query", tokenizer)]
    annotated, _ = assign_credit(verify_samples(samples, records), records, CreditConfig(kinds=("gdpo",)))
    responses = responses_table(annotated, shard=0).to_pylist()
    assert responses[0]["reward_names"] == ["keyword_include", "lowercase", "keyword_include"]
    assert responses[2]["reward_names"] == verifiers.reward_names(sql)  # other tasks keep their names

    credits = credits_table(annotated, records, tokenizer).to_pylist()
    first = [c for c in credits if c["response_id"] == "twice/0"]
    pairs = {(c["reward"], c["constraint_index"]) for c in first}
    assert pairs == {("keyword_include", 0), ("lowercase", 1), ("keyword_include", 2)}
    assert all(c["constraint_index"] is None for c in credits if c["task"] == "sql")

    tokens = [c for c in first if c["constraint_index"] == 0]
    assert "".join(c["token_text"] for c in tokens[:-1]) == "the river ran by"
    assert " river" in [c["token_text"] for c in tokens]  # decoded text, not the vocabulary entry "Ġriver"
    assert not any("Ġ" in c["token_text"] or "Ċ" in c["token_text"] for c in credits)
    assert tokens[-1]["token_text"] == tokenizer.eos_token and tokens[-1]["char_start"] == tokens[-1]["char_end"]


def test_token_parts_of_a_response_of_many_tags():
    """5000 unclosed tags with text between make 10,000 parts; each token takes the part of its last character
    (found by binary search: a scan per token was tokens x parts)."""
    tokenizer = load_tokenizer()
    record = next(r for r in verifiers.load_tasks("demo")[0] if r.task == "tools")
    records = {record.id: record}
    samples = [sample(record, 0, "<tool_call>x" * 5000, tokenizer), sample(record, 1, record.reference_response,
                                                                             tokenizer)]
    annotated, _ = assign_credit(verify_samples(samples, records), records, CreditConfig(kinds=("gdpo",)))
    credits = credits_table(annotated, records, tokenizer).to_pylist()
    first = [c for c in credits if c["response_id"] == f"{record.id}/0" and c["reward"] == "format"]
    response = samples[0].response
    assert len(verifiers.response_parts(record, response)) == 10_000
    for c in first:
        want = "special" if c["char_end"] == c["char_start"] else "tags" if response[c["char_end"] - 1] == ">" else "other"
        assert c["part"] == want, c
    assert {c["part"] for c in first} == {"tags", "other", "special"}
