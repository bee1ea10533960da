"""A vision-language model's processor (its image processor beside its tokenizer), loaded from the model's files."""

from __future__ import annotations

from transformers import Qwen2VLProcessor


class ImagesOnlyProcessor(Qwen2VLProcessor):
    """`Qwen2VLProcessor` without a video processor: transformers checks that argument's class even when it is None,
    and the check fails where torchvision (which video processors need) is not installed. Qwen2.5-VL's processor is
    the same class."""

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument is None and argument_name == "video_processor":
            return None
        return super().check_argument_for_proper_class(argument_name, argument)


def image_text_processor(image_processor, tokenizer, chat_template: str | None) -> ImagesOnlyProcessor:
    return ImagesOnlyProcessor(image_processor=image_processor, tokenizer=tokenizer, chat_template=chat_template)


def load_processor(path: str):
    """The processor of a checkpoint (its preprocessor_config.json and tokenizer files)."""
    from transformers import AutoImageProcessor, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    return image_text_processor(AutoImageProcessor.from_pretrained(path), tokenizer, tokenizer.chat_template)
