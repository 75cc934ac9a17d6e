"""One module per CLI command: ``add_arguments(parser)`` and ``run(args) -> int``."""
