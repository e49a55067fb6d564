import sys

from dsl.cli import main

sys.exit(main())
