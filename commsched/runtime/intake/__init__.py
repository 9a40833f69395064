"""How gradients reach the engine: the hooks, the passes counted, the sparse route."""
