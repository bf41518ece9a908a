"""`ConfigError` and the one-line check every config section uses."""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Iterable, Iterator


class ConfigError(ValueError):
    """A config value is missing, unknown, of the wrong type or out of range.

    Attributes:
        field: Dotted path of the offending field (e.g. ``experiment.privacy.delta``).
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)

    def under(self, prefix: str) -> ConfigError:
        """The same error with `prefix` prepended to its field path."""
        path = f"{prefix}.{self.field}" if self.field else prefix
        return ConfigError(path, self.message)


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` naming the choice closest to a mistyped `word`, or ``""``
    when none is close (`difflib`'s ratio >= 0.6: one or two letters off in a short
    word, a swapped pair, a missing underscore)."""
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ConfigError(name, message)


@contextlib.contextmanager
def as_config_error(field: str, prefix: str = "") -> Iterator[None]:
    """A `ValueError` raised inside becomes one `ConfigError` naming `field` (its message
    after `prefix`), the traceback dropped: a builder's check stays a one-line refusal."""
    try:
        yield
    except ValueError as e:
        raise ConfigError(field, f"{prefix}{e}") from None
