"""GSM8K: converting the dataset into the trainer's parquet layout (`data`, `hub`), locating the shared copy
(`shared_data`), and the verifier's reward functions (`rewards`, reading numbers with `numbers`)."""
