"""``rl-trace report``: where each step's time went — load a merged trace, compute the
figures, render them for a terminal, HTML (with SVG) and JSON."""
