"""`python -m portable_pe`: the CLI. A Ctrl-C while it is still loading (before cli.main
installs its handlers) exits 130 with one line too, not with a traceback."""

import sys

try:
    from .cli.main import entry
except KeyboardInterrupt:
    print("portable-pe: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

raise SystemExit(entry())
