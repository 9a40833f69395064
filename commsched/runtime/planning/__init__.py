"""A session's plan over its life: profile, plan, install, re-plan, and `auto`."""
