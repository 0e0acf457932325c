"""The ``rl-trace`` command: a thin shell over the library (one module per subcommand)."""
