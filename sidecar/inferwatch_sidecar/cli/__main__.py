"""``python -m inferwatch_sidecar.cli``: the same as the ``inferwatch`` command."""

import sys

from inferwatch_sidecar.cli import main

sys.exit(main())
