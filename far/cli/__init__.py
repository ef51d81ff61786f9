"""The `far` command: `far glue`, `far squad`, `far eval` and friends (see `far --help`)."""
