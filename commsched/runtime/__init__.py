"""The run of a wrapped optimizer: the session that owns it, the engine handle around
commsched._C, the plan's lifecycle, the overlap runner and its deferred updates, the sparse
route, the profiler, the timeline and checkpoints. Above world/ and plan/; below the optimizer
and K-FAC, which use it."""
