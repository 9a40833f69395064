"""The harnesses that write the project's own benchmark reports under benchmarks/: run from the
checkout (`python -m benchmarks.harness.<name>`), not installed with the package."""
