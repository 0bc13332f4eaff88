"""Bad user input → one clear line, never a traceback.

The commands (``heart run``, ``heart collect``, ``heart datasets lint``) load models and
adapters named on the command line; the libraries underneath answer a typo with a long
traceback (transformers' hub error while offline, peft's adapter checks). :class:`UserError`
carries one line that names what is wrong instead (the runtime's
:func:`heart.runtime.backends.backend_for` raises it for a model or adapter it cannot load),
and the ``heart`` CLI prints it and exits 2.
"""

from __future__ import annotations


class UserError(Exception):
    """Something the user named does not exist or does not fit; the message says which."""
