"""What a run leaves on disk and the guards around it: checkpoints and their retention, metrics.jsonl and its
curves, the finite-value guard, one-line write failures, and the fault points tests plant. Imports nothing else of
the trainer."""
