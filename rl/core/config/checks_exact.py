"""`trainer.exact_on_policy`: the combinations in which the engine's sampling logprobs can equal the trainer's bit
for bit, and the reason for each one refused (the machine's side, a GPU or a vision-language model, is checked at
preflight: `rl.trainer.preflight.checks`)."""

from __future__ import annotations

from rl.core.config.errors import Problems
from rl.core.config.schema import Config
from rl.core.config.strategies import STRATEGIES

WHY = "trainer.exact_on_policy is true, and "


def check_exact_on_policy(cfg: Config, problems: Problems) -> None:
    trainer, gen = cfg.trainer, cfg.generator
    if not trainer.exact_on_policy:
        return
    if gen.backend != "hf":
        problems.add("generator.backend", WHY + f"{gen.backend} samples with kernels of its own, whose sums run in "
                     "another order than the trainer's (vLLM's batch-invariant mode, VLLM_BATCH_INVARIANT=1, makes "
                     "its own runs agree with each other with Triton kernels on GPUs, not with another forward); set "
                     "generator.backend=hf (the trainer's own model code) or trainer.exact_on_policy=false")
    own = STRATEGIES.get(trainer.strategy).own_attention if trainer.strategy in STRATEGIES else ""
    if own:
        problems.add("trainer.strategy", WHY + f"{trainer.strategy} runs layers of its own ({own}), not the "
                     "Hugging Face model's forward the engine shares; pick a strategy that runs the Hugging Face model")
    if trainer.kernels != "auto":
        problems.add("trainer.kernels", WHY + "the token logprobs take the batch-invariant path; leave "
                     f"trainer.kernels=auto (it is {trainer.kernels})")
    if trainer.bf16:
        problems.add("trainer.bf16", WHY + "the engine samples in fp32 from the fp32 weights; set trainer.bf16=false")
    policy = trainer.policy
    if policy.use_fused_kernels:
        problems.add("trainer.policy.use_fused_kernels", WHY + "the chunked hidden-state loss sums the vocabulary "
                     "in chunks of its own; set it to false")
    if policy.sequence_parallel_size > 1:
        problems.add("trainer.policy.sequence_parallel_size", WHY + "Ulysses splits attention over ranks; set it "
                     "to 1")
    if policy.model.lora.rank > 0:
        problems.add("trainer.policy.model.lora.rank", WHY + "the engine runs the merged weights while the trainer "
                     "adds the adapters' product, another sum; set the rank to 0 (full fine-tuning)")
    if gen.top_k > 0 or gen.top_p < 1.0:
        problems.add("generator.top_k" if gen.top_k > 0 else "generator.top_p",
                     WHY + "the engine would report logprobs of the truncated, renormalised distribution while the "
                     "trainer's are of the whole one; set generator.top_k=-1 and generator.top_p=1.0")
