"""Errors that mean the user asked for something that cannot work.

The command-line tools and the Pulumi program print these as one clear message,
never as a stack trace. Anything else is a bug and keeps its traceback.
"""


class UserError(ValueError):
    """A mistake in config or arguments; the message says what and how to fix it."""


def unknown_name(kind: str, name: str, known) -> UserError:
    names = ", ".join(sorted(known))
    return UserError(f"unknown {kind} {name!r}; known {kind}s: {names}")
