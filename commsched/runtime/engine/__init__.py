"""The engine handle over commsched._C, its profiler, clock, timeline and comm hook."""
