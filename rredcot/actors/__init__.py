"""Generator actors: vLLM engines that sample verified rollout groups and stream them to Redis."""
