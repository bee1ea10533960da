"""The embedded vision-language job: a tiny Qwen2-VL model made locally and its processor."""
