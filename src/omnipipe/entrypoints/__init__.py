"""User-facing entry points: AsyncOmni, Omni and the CLI."""
