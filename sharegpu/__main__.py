"""``python -m sharegpu``."""

from sharegpu.cli import main

raise SystemExit(main())
