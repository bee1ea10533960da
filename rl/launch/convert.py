"""`bazel run //rl/launch:convert -- --direction=hf_to_megatron --input=HF_DIR --output=DIR --tp=2 [--pp=1 --ep=1]`
`bazel run //rl/launch:convert -- --direction=megatron_to_hf --input=DIR --output=HF_DIR [--hf_config=HF_DIR]`

Converts a Hugging Face checkpoint into megatron shard files for a TP/PP/EP layout (one file per model-parallel rank,
Megatron-LM's `mp_rank_TT_PPP_EEE/model_optim_rng.pt` layout, which the megatron backend loads), and back into
safetensors that `transformers` loads. Runs in one process; no GPU needed.
"""

import sys

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_enum("direction", None, ("hf_to_megatron", "megatron_to_hf"), "Which way to convert.")
flags.DEFINE_string("input", None, "Source directory.")
flags.DEFINE_string("output", None, "Destination directory (must not exist).")
flags.DEFINE_integer("tp", 1, "Tensor-parallel size of the megatron checkpoint (hf_to_megatron).")
flags.DEFINE_integer("pp", 1, "Pipeline-parallel size (hf_to_megatron).")
flags.DEFINE_integer("ep", 1, "Expert-parallel size, mixture-of-experts models (hf_to_megatron).")
flags.DEFINE_string("hf_config", None, "megatron_to_hf: HF directory with config and tokenizer (default: the source "
                    "recorded at conversion).")
flags.mark_flags_as_required(["direction", "input", "output"])


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    from rl.backends.megatron.hf_io import hf_to_megatron_checkpoint, megatron_checkpoint_to_hf

    try:
        if FLAGS.direction == "hf_to_megatron":
            if min(FLAGS.tp, FLAGS.pp, FLAGS.ep) < 1:
                raise ValueError("--tp, --pp and --ep must be >= 1")
            hf_to_megatron_checkpoint(FLAGS.input, FLAGS.output, FLAGS.tp, FLAGS.pp, FLAGS.ep)
        else:
            megatron_checkpoint_to_hf(FLAGS.input, FLAGS.output, FLAGS.hf_config)
    except (ValueError, FileExistsError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {FLAGS.output}")
    return 0


if __name__ == "__main__":
    sys.exit(app.run(main))
