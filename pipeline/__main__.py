from __future__ import annotations

import sys

from pipeline.entry import main

sys.exit(main())
