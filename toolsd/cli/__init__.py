"""The `toolsd` command line: one module per subcommand, registered by main.py."""
