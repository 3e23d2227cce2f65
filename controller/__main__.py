"""``python -m controller``."""

from controller.main import main

raise SystemExit(main())
