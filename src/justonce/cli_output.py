"""What the command line prints: text that came from a user or the database is shown as
it is, and nothing in it can act on the terminal.

Every string the CLI prints with ``out`` or ``err`` (a line, a table cell, a title) passes
through ``visible``: rich never reads it as markup (``[/x]`` raised MarkupError, and
``[red]x[/red]`` showed as ``x``) nor as an emoji code (``:thumbs_up:``), and a control
character shows as an escape (``\\x1b``) instead of reaching the terminal. The CLI's own
styling is a ``style=`` argument, never markup inside the string. Because the escaping
happens where rich turns a string into text, a command cannot forget it, and printing a
result cannot raise on what the result contains (``effects resolve`` writes, then prints).
"""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.text import Text

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f"  # C0, DEL and C1: ESC starts a terminal command, and C1 0x9b is CSI
    "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"  # bidi marks and overrides: they reorder
    # what follows them, so a key can read as another
    "\u2028\u2029"  # line and paragraph separators: a row of a table would break
    "\ud800-\udfff]"  # lone surrogates (a name read with surrogateescape): not encodable
)


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def visible(text: str) -> str:
    """``text`` on one line with every control character, bidi control, line separator
    and lone surrogate written as its Python escape (``\\x1b``, ``\\n``, ``\\u202e``);
    everything else, backslashes included, is left as it is."""
    return _UNSAFE.sub(_escape, text)


class _Plain(Console):
    """A Console that shows every string it is given as plain text, through ``visible``.
    (rich calls ``render_str`` for each string it prints, table cells and titles too.)"""

    def render_str(self, text: str, **options: Any) -> Text:
        options.update(markup=False, emoji=False, highlight=False)
        return super().render_str(visible(text), **options)


out = _Plain()
"""Standard output of the CLI."""
err = _Plain(stderr=True)
"""Standard error of the CLI."""


def print_lines(text: str, console: Console = out) -> None:
    """A text of several lines (a traceback), one printed line per line."""
    for line in text.split("\n"):
        console.print(line)
