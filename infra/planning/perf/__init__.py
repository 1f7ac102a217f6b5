"""Performance model of vLLM serving: step times, scheduling and load (pure functions)."""
