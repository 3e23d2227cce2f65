"""``python -m kubeletplugin``."""

from kubeletplugin.main import main

raise SystemExit(main())
