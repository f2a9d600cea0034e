"""Storage of a run's state: checkpoints, the saves the loop makes, warm starts, Hugging Face Llama."""
