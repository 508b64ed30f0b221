"""The ``setdlm`` subcommands, each a ``Command`` (command.py); ``setdlm.cli.COMMANDS`` lists
them all, in the order ``setdlm --help`` shows them.

A command declares its options in ``add_arguments(parser)`` and runs in ``run(args)``, which
returns the exit code. ``add_arguments`` imports nothing heavy, so that the parser stays fast
to build; ``run`` imports what the command needs.
"""
