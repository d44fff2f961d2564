"""Learner: DeepSpeed training on σ-weighted batches and versioned weight broadcast."""
