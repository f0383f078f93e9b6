"""`python -m stallscope` is the same front door as the console script."""

from __future__ import annotations

import sys

from stallscope.cli import main

if __name__ == "__main__":
    sys.exit(main())
