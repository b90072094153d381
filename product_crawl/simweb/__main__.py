"""``python -m product_crawl.simweb [--profile paper|FILE] [--port N] [--host H] [--seed N]``."""

from __future__ import annotations

import sys

from product_crawl.simweb.server import main

if __name__ == "__main__":
    sys.exit(main())
