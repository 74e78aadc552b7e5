"""``python -m attn_export.cli``: the same as the ``attn-export`` command."""

import os
import sys

from attn_export.cli import main  # light: the package defers every import to main()

code = main()
if code in (130, 143):
    # Interrupted, and already cleaned up. Under ``python -m``, CPython's Py_RunMain ends the
    # process with SIGINT (exit -2, not 130) whenever a KeyboardInterrupt once escaped an
    # exec()'d string (dataclasses and typing build methods that way), even if it was caught
    # later; os._exit keeps the documented exit status.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
sys.exit(code)
