"""The `slogate` command: one dispatcher above every package, importing each lazily."""
