"""Lossy compression at run time: PowerSGD, top-k and DGC, as a comm hook."""
