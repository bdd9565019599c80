from __future__ import annotations

import sys

from pipeline.cli import main

sys.exit(main())
