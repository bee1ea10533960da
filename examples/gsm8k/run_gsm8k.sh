#!/usr/bin/env bash
# GRPO on GSM8K with Qwen2.5-1.5B-Instruct on one node of NUM_GPUS GPUs (default 8), strategy fsdp2.
#
#   bazel run //rl/launch:prepare_gsm8k -- --run_dir=$HOME/data/gsm8k    # once
#   bash examples/gsm8k/run_gsm8k.sh                                        # 8 GPUs
#   NUM_GPUS=4 bash examples/gsm8k/run_gsm8k.sh trainer.strategy=deepspeed  # extra key=value overrides win
#
# Environment: NUM_GPUS (default 8), DATA_DIR (default $HOME/data/gsm8k), BAZEL (default bazel; ./bazelw works too).
# Any argument is passed on to the launcher after the settings below, so it overrides them; flags such as
# --run_dir=DIR or --strategy=megatron are accepted as well.
set -euo pipefail

NUM_GPUS="${NUM_GPUS:-8}"
DATA_DIR="${DATA_DIR:-$HOME/data/gsm8k}"
BAZEL="${BAZEL:-bazel}"
# The Python environment with CUDA torch (see the README's "On a GPU machine").
export RL_PYTHON_LOCK=gpu

for split in train validation; do
  if [[ ! -f "$DATA_DIR/$split.parquet" ]]; then
    echo "missing $DATA_DIR/$split.parquet; prepare the data first:" >&2
    echo "  $BAZEL run //rl/launch:prepare_gsm8k -- --run_dir=$DATA_DIR" >&2
    exit 1
  fi
done

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

# Batch arithmetic: 256 prompts x 5 samples = 1280 sequences per optimizer step, split into micro-batches of 32
# sequences per GPU; 1280 is a multiple of 32 * NUM_GPUS for 1, 2, 4 and 8 GPUs. With sample packing on, a
# micro-batch is bounded by max_tokens_per_micro_batch tokens instead (sequences are at most 512 + 1024 tokens).
"$BAZEL" run //rl/launch:train -- \
  trainer.strategy=fsdp2 \
  trainer.policy.model.path=Qwen/Qwen2.5-1.5B-Instruct \
  data.train_data="['$DATA_DIR/train.parquet']" \
  data.val_data="['$DATA_DIR/validation.parquet']" \
  data.reward_fn=gsm8k \
  trainer.placement.colocate_all=true \
  trainer.placement.policy_num_nodes=1 \
  trainer.placement.policy_num_gpus_per_node="$NUM_GPUS" \
  trainer.algorithm.advantage_estimator=grpo \
  trainer.algorithm.use_kl_loss=true \
  trainer.algorithm.kl_loss_coef=0.001 \
  trainer.epochs=20 \
  trainer.max_steps=null \
  trainer.train_batch_size=1024 \
  trainer.policy_mini_batch_size=256 \
  trainer.micro_forward_batch_size_per_gpu=32 \
  trainer.micro_train_batch_size_per_gpu=32 \
  trainer.use_sample_packing=true \
  trainer.max_tokens_per_micro_batch=8192 \
  trainer.gradient_checkpointing=true \
  trainer.policy.optimizer_config.lr=1.0e-6 \
  generator.n_samples_per_prompt=5 \
  generator.max_prompt_length=512 \
  generator.max_generate_length=1024 \
  generator.temperature=1.0 \
  trainer.eval_before_train=true \
  trainer.eval_interval=5 \
  trainer.ckpt_interval=10 \
  trainer.logger="['console','tensorboard']" \
  trainer.project_name=gsm8k \
  trainer.run_name=gsm8k_qwen2.5_1.5b \
  "$@"
