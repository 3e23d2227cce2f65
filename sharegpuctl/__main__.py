"""``python -m sharegpuctl``."""

from sharegpuctl.cli import main

raise SystemExit(main())
