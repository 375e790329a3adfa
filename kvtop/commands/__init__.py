"""Commands: one module per kvtop command, each a parser and a run(args) -> exit code."""
