"""SFT and preference rows through the embedded tokenizer's chat template: the loss mask covers exactly the
assistant turns' tokens (checked against the template's text written out here), and bad rows are refused with a
`DataError` naming the row and the key that fixes it (the `sft:` / `dpo:` blocks themselves:
tests/rl/core/config/test_supervised_config.py)."""

import io
import json

import pytest
from PIL import Image

from rl.core.data.errors import DataError
from rl.core.data.readers import RawRow
from rl.core.data.supervised import SupervisedDataSpec, load_sft_examples, preference_pair, sft_example
from rl.tasks.embedded.tokenizer import build_tokenizer

TOKENIZER = build_tokenizer()
SPEC = SupervisedDataSpec()


def _row(**values):
    return RawRow("data.jsonl line 3", values)


def _decoded(ids, mask, keep=True):
    return "".join(TOKENIZER.convert_ids_to_tokens([i for i, m in zip(ids, mask, strict=True) if m == keep]))


def test_loss_mask_covers_every_assistant_turn_and_its_end_token():
    messages = [{"role": "system", "content": "Answer"}, {"role": "user", "content": "What is 1 + 2?"},
                {"role": "assistant", "content": "3"}, {"role": "user", "content": "What is 2 + 2?"},
                {"role": "assistant", "content": "4 #### 4"}]
    example = sft_example(TOKENIZER, _row(messages=messages), SPEC)
    ids, mask = example["input_ids"].tolist(), example["loss_mask"].tolist()
    # the template: <|bos|> then <|role|>content<|end|> per message
    assert _decoded(ids, mask) == "3<|end|>4 #### 4<|end|>"
    assert not mask[0]


def test_prompt_response_rows_and_a_list_prompt():
    plain = sft_example(TOKENIZER, _row(prompt="What is 1 + 2?", response="3"), SPEC)
    chat = sft_example(TOKENIZER, _row(prompt=[{"role": "user", "content": "What is 1 + 2?"}], response="3"), SPEC)
    assert plain["input_ids"].tolist() == chat["input_ids"].tolist()
    assert _decoded(plain["input_ids"].tolist(), plain["loss_mask"].tolist()) == "3<|end|>"


@pytest.mark.parametrize(("values", "needle"), [
    ({"messages": [{"role": "user", "content": "What is 1 + 2?"}]}, "no assistant turn"),
    ({"messages": [{"role": "robot", "content": "3"}]}, "unknown role 'robot'"),
    ({"question": "What is 1 + 2?"}, "sft.messages_key"),
])
def test_bad_sft_rows_are_refused_by_name(values, needle):
    with pytest.raises(DataError, match=r"data\.jsonl line 3") as error:
        sft_example(TOKENIZER, _row(**values), SPEC)
    assert needle in str(error.value)


def test_a_long_conversation_is_refused_or_cut_as_the_key_says():
    row = _row(prompt="What is 1 + 2?", response="1 2 3 4 5 6 7 8 9")
    full = sft_example(TOKENIZER, row, SPEC)["input_ids"].numel()
    with pytest.raises(DataError, match=r"more than sft.max_length=18; raise sft.max_length, or set sft.truncate"):
        sft_example(TOKENIZER, row, SupervisedDataSpec(max_length=18))
    cut = sft_example(TOKENIZER, row, SupervisedDataSpec(max_length=18, truncate=True))
    assert cut["input_ids"].numel() == 18 < full and bool(cut["loss_mask"].any())
    with pytest.raises(DataError, match="keeps no assistant token"):
        sft_example(TOKENIZER, row, SupervisedDataSpec(max_length=10, truncate=True))


def test_preference_pairs_and_identical_responses():
    spec = SupervisedDataSpec(section="dpo")
    chosen, rejected = preference_pair(TOKENIZER, _row(prompt="What is 5 + 5?", chosen="10", rejected="0"), spec)
    assert _decoded(chosen["input_ids"].tolist(), chosen["loss_mask"].tolist()) == "10<|end|>"
    assert _decoded(rejected["input_ids"].tolist(), rejected["loss_mask"].tolist()) == "0<|end|>"
    assert chosen["input_ids"][:5].tolist() == rejected["input_ids"][:5].tolist()
    with pytest.raises(DataError, match="chosen and rejected responses are identical"):
        preference_pair(TOKENIZER, _row(prompt="What is 5 + 5?", chosen="10", rejected="10"), spec)
    with pytest.raises(DataError, match=r"set dpo\.rejected_key"):
        preference_pair(TOKENIZER, _row(prompt="What is 5 + 5?", chosen="10"), spec)


def test_files_are_read_with_the_row_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "What is 1 + 2?"},
                                             {"role": "assistant", "content": "3"}]}) + "\n"
                    + json.dumps({"messages": [{"role": "user", "content": "What is 1 + 2?"}]}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl line 2: the conversation has no assistant turn"):
        load_sft_examples(TOKENIZER, [path], SPEC)



def _png(filled: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (56, 28 * filled), (200, 0, 0)).save(out, format="PNG")
    return out.getvalue()


def test_rows_with_images_encode_through_the_processor_with_their_pixels():
    """A vision-language SFT row: the ids are the processor's for the whole conversation (each image's placeholder
    once per merged patch), the mask covers the assistant's tokens only, and the example carries the images' pixel
    values and grids in order; marks that do not match the images, and images for a text model, are refused."""
    from rl.tasks.embedded_vl.model import IMAGE_PAD, build_processor

    processor = build_processor()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many squares?"},
                                             {"type": "image"}]},
                {"role": "assistant", "content": "1+1=2 #### 2"}]
    images = [{"bytes": _png(1)}, {"bytes": _png(2)}]
    example = sft_example(processor, _row(messages=messages, images=images), SPEC)
    ids, mask = example["input_ids"].tolist(), example["loss_mask"].tolist()
    text = ("<|bos|><|user|><|vision_start|><|image_pad|><|vision_end|>How many squares?<|vision_start|>"
            "<|image_pad|><|vision_end|><|end|><|assistant|>1+1=2 #### 2<|end|>")
    pixels = [Image.open(io.BytesIO(entry["bytes"])).convert("RGB") for entry in images]
    oracle = processor(text=[text], images=pixels, return_tensors="pt")
    assert ids == oracle["input_ids"][0].tolist()
    pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    assert ids.count(pad) == 2 + 4  # each image's patches merged 2 x 2: 56 x 28 -> 2, 56 x 56 -> 4
    assert processor.tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m]) == "1+1=2 #### 2<|end|>"
    assert example["images"].grid_thw.tolist() == oracle["image_grid_thw"].tolist()
    assert example["images"].pixel_values.equal(oracle["pixel_values"])
    with pytest.raises(DataError, match=r"data\.jsonl line 3: the conversation marks 2 image\(s\).*but the row has 1"):
        sft_example(processor, _row(messages=messages, images=images[:1]), SPEC)
    with pytest.raises(DataError, match=r"data\.jsonl line 3: has 2 image\(s\), but the model is a text model"):
        sft_example(TOKENIZER, _row(messages=messages, images=images), SPEC)
    with pytest.raises(DataError, match="a row with images is never cut"):
        sft_example(processor, _row(messages=messages, images=images), SupervisedDataSpec(max_length=8, truncate=True))


def test_files_whose_every_response_is_empty_are_refused(tmp_path):
    from rl.core.data.supervised import check_rows

    path = tmp_path / "empty.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"What is {k} + 2?"}, {"role": "assistant", "content": " "}]}
            for k in range(3)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(DataError, match=rf"{path}: every assistant turn of its 3 rows is empty"):
        check_rows([path], SPEC, paired=False)
    rows[1]["messages"][1]["content"] = "4"  # one response with words is something to learn
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert check_rows([path], SPEC, paired=False) == 3
