"""``python -m attn_export.cli``: the same as the ``attn-export`` command."""

import sys

from attn_export.cli import main  # light: the package defers every import to main()

sys.exit(main())
