"""`bazel run //rl/launch:convert -- --direction=checkpoint_to_hf --input=RUN/checkpoints/global_step_N --run_dir=HF`
`bazel run //rl/launch:convert -- --direction=hf_to_megatron --input=HF_DIR --run_dir=DIR --tp=2 [--pp=1 --ep=1]`
`bazel run //rl/launch:convert -- --direction=megatron_to_hf --input=DIR --run_dir=HF_DIR [--hf_config=HF_DIR]`

`checkpoint_to_hf` reads a training checkpoint of any strategy (every rank's files; the strategy and the model it
started from are recorded in its trainer_state.json) into safetensors that `transformers` loads, which any strategy
then starts from (`trainer.policy.model.path`); with `--model=critic` the checkpoint's critic, as the one-label token
classifier `trainer.critic.model.path` starts from. The megatron directions convert a Hugging Face checkpoint into
megatron shard files for a TP/PP/EP layout (one file per model-parallel rank, Megatron-LM's
`mp_rank_TT_PPP_EEE/model_optim_rng.pt` layout, which the megatron backend loads) and back. Runs in one process; no
GPU needed.
"""

import sys

from absl import flags

from rl.launch import cli

FLAGS = flags.FLAGS
flags.DEFINE_enum("direction", None, ("checkpoint_to_hf", "hf_to_megatron", "megatron_to_hf"), "Which way to convert.")
flags.DEFINE_string("input", None, "Source directory.")
flags.DEFINE_string("run_dir", None, "Destination directory (must not exist).")
cli.define_old_name("output", "run_dir", __name__)
flags.DEFINE_integer("tp", 1, "Tensor-parallel size of the megatron checkpoint (hf_to_megatron).")
flags.DEFINE_integer("pp", 1, "Pipeline-parallel size (hf_to_megatron).")
flags.DEFINE_integer("ep", 1, "Expert-parallel size, mixture-of-experts models (hf_to_megatron).")
flags.DEFINE_string("hf_config", None, "megatron_to_hf, checkpoint_to_hf: HF directory with config and tokenizer "
                    "(default: the model recorded in the checkpoint).")
flags.DEFINE_string("strategy", None, "checkpoint_to_hf: the strategy that wrote the checkpoint, for checkpoints "
                    "that do not record it.")
flags.DEFINE_enum("model", "policy", ("policy", "critic"), "checkpoint_to_hf: which trained model to convert.")
flags.mark_flags_as_required(["direction", "input", "run_dir"])


def training_checkpoint_to_hf(path: str, out_dir: str, hf_config: str | None, strategy: str | None,
                              model: str = "policy") -> None:
    """A verified training checkpoint's weights (its policy's or its critic's), through its strategy's reader, as
    a Hugging Face checkpoint."""
    import os

    from rl.backends.hf_model import save_hf_checkpoint
    from rl.backends.registry import backend_class
    from rl.core.config.strategies import STRATEGIES
    from rl.trainer.state import checkpoint

    if not checkpoint.is_complete(path):
        raise ValueError(f"{path} is not a complete training checkpoint (a global_step_N directory with a "
                         f"{checkpoint.MARKER} marker)")
    damaged = checkpoint.verify(path)
    if damaged:
        raise ValueError(f"{path} is damaged: {'; '.join(damaged)}")
    state = checkpoint.read_trainer_state(path)
    strategy = state.get("strategy") or strategy
    critic = model == "critic"
    if critic and "critic_model_path" not in state:
        raise ValueError(f"{path} holds no critic (its run did not train one: advantage_estimator gae)")
    model_path = hf_config or state.get("critic_model_path" if critic else "model_path")
    if strategy is None or model_path is None:
        raise ValueError(f"{path}/{checkpoint.TRAINER_STATE} does not record "
                         f"{'the strategy; pass --strategy' if strategy is None else 'the model; pass --hf_config'}")
    if strategy not in STRATEGIES:
        raise ValueError(f"--strategy {strategy}: not a strategy; choose from {', '.join(STRATEGIES)}")
    if os.path.exists(out_dir):
        raise FileExistsError(f"{out_dir} already exists; conversions are never overwritten")
    from rl.backends.worker import CRITIC_DIR

    weights = backend_class(strategy).checkpoint_weights(os.path.join(path, CRITIC_DIR) if critic else path,
                                                         model_path)
    save_hf_checkpoint(model_path, weights, out_dir, critic=critic)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print(f"error: unexpected arguments: {' '.join(argv[1:])}; `--help` lists the flags", file=sys.stderr)
        return 2
    import rl.backends.registry  # noqa: F401  (the strategies' checkpoint readers)
    from rl.backends.megatron.hf_io import hf_to_megatron_checkpoint, megatron_checkpoint_to_hf

    try:
        if FLAGS.direction == "checkpoint_to_hf":
            training_checkpoint_to_hf(FLAGS.input, FLAGS.run_dir, FLAGS.hf_config, FLAGS.strategy, FLAGS.model)
        elif FLAGS.direction == "hf_to_megatron":
            if min(FLAGS.tp, FLAGS.pp, FLAGS.ep) < 1:
                raise ValueError("--tp, --pp and --ep must be >= 1")
            hf_to_megatron_checkpoint(FLAGS.input, FLAGS.run_dir, FLAGS.tp, FLAGS.pp, FLAGS.ep)
        else:
            megatron_checkpoint_to_hf(FLAGS.input, FLAGS.run_dir, FLAGS.hf_config)
    except (ValueError, FileExistsError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {FLAGS.run_dir}")
    return 0


if __name__ == "__main__":
    cli.run(main)
