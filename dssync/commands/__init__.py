"""One module per ``dssync`` subcommand, each with ``add_parser(subparsers)`` and ``run(args)``."""
