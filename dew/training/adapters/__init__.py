"""What wraps a model's weights for training: LoRA, quantized training, merging LoRA back."""
