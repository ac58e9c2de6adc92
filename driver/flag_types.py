"""How ``elastic-run``'s flags (``driver.flags``) are read: a parser whose errors are a
``UsageError`` and that takes no flag by a prefix of its name (``RaisingParser``), and
the converters of the flags' numbers (``number_type``), each checking its bounds and
naming what it wants, so a bad value is one line naming the flag.

Why apart: the flags' declarations and help are the user's text; how a value is read
and refused is the same for every flag, and changes for other reasons.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable

from driver.errors import UsageError
from driver.hosts.slots import MAX_SLOTS_PER_HOST, MAX_WORKERS, quote_entry


class RaisingParser(argparse.ArgumentParser):
    """argparse reports errors by printing and exiting; we want a ``UsageError``. No
    flag is ever taken by a prefix of its name: ``allow_abbrev=False`` covers only
    ``--long`` flags, and argparse still reads ``-n 2`` as ``-np 2``."""

    def _get_option_tuples(self, option_string: str) -> list:
        return []  # (argparse's prefix matching, for flags of one dash too)

    def error(self, message: str):
        raise UsageError(self._name_full_flags(message))

    def _name_full_flags(self, message: str) -> str:
        """An unrecognized argument that abbreviates one of our flags names the flag in
        full: a typo must not look like a flag we do not have."""
        prefix = "unrecognized arguments: "
        if not message.startswith(prefix):
            return message
        flags = [f for action in self._actions for f in action.option_strings]
        hints = []
        for arg in message[len(prefix) :].split():
            name = arg.split("=", 1)[0]
            if not name.startswith("-") or len(name) < 2:
                continue
            meant = sorted(f for f in flags if f.startswith(name) and f != name)
            if meant:
                hints.append(
                    f"{name} is no flag (abbreviations are not taken): did you mean "
                    + " or ".join(meant)
                    + "?"
                )
        return message + ("; " + "; ".join(hints) if hints else "")


def number_type(
    kind: Callable[[str], float],
    minimum: float,
    strict: bool,
    what: str,
    maximum: tuple[int, str] | None = None,
):
    """An argparse ``type`` converting to ``kind`` and checking the bounds (``maximum``:
    the largest value and why); argparse adds the flag name to the message ("argument
    --x: must be ...")."""

    def convert(text: str):
        digits = text.strip().lstrip("+")
        if (
            maximum is not None
            and digits.isdigit()
            and len(digits.lstrip("0")) > len(str(maximum[0]))
        ):
            # Before converting: a thousand-digit number is too big all the same.
            raise argparse.ArgumentTypeError(
                f"must be at most {maximum[0]} ({maximum[1]}), got {quote_entry(text)}"
            )
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {quote_entry(text)}") from None
        if (
            math.isnan(value)
            or math.isinf(value)
            or value < minimum
            or (strict and value == minimum)
        ):
            raise argparse.ArgumentTypeError(f"must be {what}, got {quote_entry(text)}")
        if maximum is not None and value > maximum[0]:
            raise argparse.ArgumentTypeError(
                f"must be at most {maximum[0]} ({maximum[1]}), got {quote_entry(text)}"
            )
        return value

    convert.__name__ = what  # argparse names the type in some messages
    return convert


worker_count = number_type(
    int, 0, True, "a whole number >= 1", (MAX_WORKERS, "the most workers one job may have")
)
slot_count = number_type(
    int, 0, True, "a whole number >= 1", (MAX_SLOTS_PER_HOST, "the most slots of one host")
)
non_negative_int = number_type(int, 0, False, "a whole number >= 0")
spare_count = number_type(
    int, 0, False, "a whole number >= 0", (MAX_SLOTS_PER_HOST, "the most slots of one host")
)
ps_replicas = number_type(int, 0, False, "0 or 1", (1, "a shard has at most one backup"))
positive_seconds = number_type(float, 0.0, True, "a number of seconds > 0")
non_negative_seconds = number_type(float, 0.0, False, "a number of seconds >= 0")
