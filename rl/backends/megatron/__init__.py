"""Strategy `megatron`: megatron-core GPT models (TP, PP, EP, SP) converted from Hugging Face checkpoints."""
