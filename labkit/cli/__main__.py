"""``python -m labkit.cli ...``: the ``labkit`` script run as a module (e.g. ``python -m labkit.cli explain
--markdown > docs/errors.md``)."""

import sys

from labkit.cli.entry_point import main

sys.exit(main())
