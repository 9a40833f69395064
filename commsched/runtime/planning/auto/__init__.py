"""`auto`: the choice among every policy's simulated plan, and its trials."""
