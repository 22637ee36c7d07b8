"""Training from a run: token-weighted losses, the offline trainer, the tiny policy's feedback data."""
