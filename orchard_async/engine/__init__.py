"""The engine: what runs (plan), the sandboxes it runs in (pool, warm stock, group setups), one
episode's attempt, and the rollout that drives them all under one task group."""
