"""Built-in benchmark models (synthetic data) and the side-by-side comparison harness."""
