"""Sampling with vLLM on a CUDA device (the optional `[gpu]` extra).

vllm is imported inside `VllmSampler.__init__` only, so the CPU path never loads it. Prompts are
rendered and tokenized exactly as in `TransformersSampler` and handed to vLLM as token ids.

Log-probabilities: the engine is built with `logprobs_mode="raw_logprobs"` (vLLM V1's default), i.e.
log-softmax of the model's logits before temperature, penalties and top-p, the same quantity
`TransformersSampler` stores. With `logprobs=0` vLLM returns only the sampled token's log-prob.

Randomness: each record gets its own request seed `row_seed(seed, record id, 0)`, so its n samples do
not depend on the rest of the batch; the draws differ from the transformers backend's (another RNG),
only greedy decoding is expected to agree between backends.
"""
from __future__ import annotations

from collections.abc import Sequence

from tokencredit.schemas.records import Sample, TaskRecord

from tokencredit.pipeline.sample.detokenize import truncate_at_stop
from tokencredit.pipeline.models.loading import DEFAULT_POLICY, load_tokenizer, model_name, resolve_model_path
from tokencredit.pipeline.config import SamplingConfig
from tokencredit.pipeline.sample.rows import build_sample, check_records, render_prompt, row_seed

NEEDS_GPU = "the vllm backend needs the [gpu] extra and a CUDA device; use --backend transformers"


class VllmSampler:
    def __init__(self, model_path: str | None = None, *, dtype=None, trust_remote_code: bool = False,
                 enforce_eager: bool = False, gpu_memory_utilization: float = 0.5, progress: bool = True):
        """`gpu_memory_utilization`: share of the GPU vLLM reserves; the rest is left for the policy and
        reward model that the credit stage loads in the same process."""
        try:
            import torch
            import vllm
        except ImportError as error:
            raise RuntimeError(f"{NEEDS_GPU} ({error})") from error
        if not torch.cuda.is_available():
            raise RuntimeError(f"{NEEDS_GPU} (no CUDA device is visible)")
        folder = str(resolve_model_path(model_path, DEFAULT_POLICY))
        self.vllm, self.progress, self.name = vllm, progress, model_name(model_path)
        self.tokenizer = load_tokenizer(folder, trust_remote_code=trust_remote_code)
        self.llm = vllm.LLM(model=folder, tokenizer=folder, trust_remote_code=trust_remote_code, seed=0,
                            dtype=str(dtype).removeprefix("torch.") if dtype else "auto", enforce_eager=enforce_eager,
                            gpu_memory_utilization=gpu_memory_utilization, logprobs_mode="raw_logprobs")

    def sample(self, records: Sequence[TaskRecord], config: SamplingConfig) -> list[Sample]:
        check_records(records)
        prompts = [render_prompt(self.tokenizer, r.prompt) for r in records]
        params = [self.vllm.SamplingParams(n=config.n, temperature=config.temperature, top_p=config.top_p,
                                           max_tokens=config.max_new_tokens, stop=list(config.stop), logprobs=0,
                                           seed=row_seed(config.seed, r.id, 0)) for r in records]
        outputs = self.llm.generate([{"prompt_token_ids": ids} for _, ids in prompts], params,
                                    use_tqdm=self.progress)
        samples = []
        for record, prompt, output in zip(records, prompts, outputs):
            for j, completion in enumerate(sorted(output.outputs, key=lambda c: c.index)):
                token_ids = truncate_at_stop(self.tokenizer, list(completion.token_ids), config.stop)
                logprobs = [completion.logprobs[t][token].logprob for t, token in enumerate(token_ids)]
                samples.append(build_sample(record, j, prompt, token_ids, logprobs, self.tokenizer, self.name,
                                            config.seed))
        return samples
