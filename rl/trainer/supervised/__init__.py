"""The supervised drivers: SFT (`sft_loop`) and DPO (`dpo_loop`) over the shared `driver`, with their own
`preflight`. The top of the trainer: only `rl.launch.sft`/`dpo` import it."""
