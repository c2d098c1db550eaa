"""``python -m inferwatch`` runs the same CLI as the ``inferwatch`` script."""

import sys

from inferwatch._cli import main

sys.exit(main())
