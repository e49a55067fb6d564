import os
import sys

try:                            # Ctrl-C before dsl/cli.py's own guard is reached
    from dsl.cli import main
except KeyboardInterrupt:
    print("dslc: interrupted", file=sys.stderr)
    os._exit(130)

sys.exit(main())
