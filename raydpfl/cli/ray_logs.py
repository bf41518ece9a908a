"""Ray's log lines that say nothing a user of `raydpfl run` or `tune` can act on.

They are kept off the terminal, not switched off: worker lines still reach Ray's log
files (/tmp/ray/session_*/logs), and every other line (a worker's traceback, a warning
of ours) is still printed.
"""

from __future__ import annotations

import logging
import os

#: Worker log lines the driver does not print (Ray's RAY_DEDUP_LOGS_SKIP_REGEX). Each run
#: creates its worker actors with restarts and large constructor arguments, and Ray 2.60
#: logs an error-level line about that combination for each of them.
WORKER_LINES_SKIPPED = r"core_worker\.cc:\d+: Actor with class name: .* max_restarts > 0"

#: Ray 2.60 turns token authentication on for every new local instance and warns that it
#: did, on every run. It stays on; only the line goes.
_TOKEN_LOGGER = "ray._private.authentication.authentication_token_setup"
_TOKEN_LINE = "Token authentication is enabled for this Ray cluster"


class _DropTokenNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _TOKEN_LINE not in record.getMessage()


def quiet_ray() -> None:
    """Quiets the lines above; call it before Ray is imported (Ray reads the skip pattern
    once, on import). A pattern the user set in the environment is kept."""
    os.environ.setdefault("RAY_DEDUP_LOGS_SKIP_REGEX", WORKER_LINES_SKIPPED)
    logger = logging.getLogger(_TOKEN_LOGGER)
    if not any(isinstance(f, _DropTokenNotice) for f in logger.filters):
        logger.addFilter(_DropTokenNotice())
