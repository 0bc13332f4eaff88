"""Bad user input → one clear line, never a traceback.

The commands (``heart run``, ``heart collect``, ``heart datasets lint``) load models and
adapters named on the command line; the libraries underneath answer a typo with a long
traceback (transformers' hub error while offline, peft's adapter checks). This module owns
the translation: :class:`UserError` carries one line that names what is wrong, and the
``heart`` CLI prints it and exits 2.
"""

from __future__ import annotations

import os


class UserError(Exception):
    """Something the user named does not exist or does not fit; the message says which."""


EMBEDDED_NAMES = "smollm2-135m, tiny-qwen3"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def transformers_backend(model: str, adapters: dict[str, str] | None = None, engine: str = "peft", **options):
    """An in-process backend (:func:`heart.runtime.engines.local_backend`; transformers +
    peft by default), or :class:`UserError` when the model or an adapter cannot be found or
    loaded."""
    from heart.runtime.engines import local_backend

    try:
        return local_backend(engine, model, adapters or {}, **options)
    except FileNotFoundError as err:  # a missing model folder, or an adapter without adapter_config.json
        raise UserError(str(err).strip('"')) from None
    except OSError as err:  # transformers: not a folder, not cached, and no download allowed / possible
        if _offline():
            raise UserError(f"model {model!r} is not an embedded model ({EMBEDDED_NAMES}), not a local "
                            "folder, and not in the Hugging Face cache; downloads are off "
                            "(HF_HUB_OFFLINE=1)") from None
        raise UserError(f"cannot load model {model!r}: {str(err).splitlines()[0]}") from None
    except (ValueError, RuntimeError, KeyError) as err:  # a broken adapter folder, or one for another base
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        where = f" with adapters {adapters}" if adapters else ""
        raise UserError(f"cannot load model {model!r}{where}: {first_line}") from None
