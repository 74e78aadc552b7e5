"""``python -m attn_export.cli``: the same as the ``attn-export`` command."""

import sys

from attn_export.cli.app import main

sys.exit(main())
