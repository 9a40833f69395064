"""The overlap mode: updates applied in the next forward pass, and its runner."""
