"""``rl-trace watch``: a run followed while it trains, each finished step answered (docs/watch.md)."""
