"""What a finished run's timelines and profile say about it: the analysis (pure), its table and
plot, and the ``python -m commsched report`` command."""
