"""Exit codes every kvtop command shares (each command documents its own on top: ``check``
0 no leak, 1 leak, 3 no usable data, 4 stalled; ``snapshot`` 3 a target unreadable)."""

EXIT_USAGE = 2  # a bad option, config or input file: the message says which
EXIT_INTERNAL = 70  # EX_SOFTWARE, a bug; never 1, which `check` uses for "leak found"
EXIT_INTERRUPTED = 130  # Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a tool whose reader left

EXIT_OK = 0
EXIT_LEAK = 1  # check: a leak found
EXIT_NO_DATA = 3  # check: no usable data for a verdict
EXIT_STALLED = 4  # check: an engine stalled (and no leak)
