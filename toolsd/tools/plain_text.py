"""`plain: true` reads of a terminal's output: the text without terminal escape sequences.
Pure.

Removed: control sequences (CSI, `ESC [ ... final`, and its one-character form U+009B),
operating system commands and the other string sequences (`ESC ] ... BEL` or `... ESC \\`,
and DCS, SOS, PM, APC), the other escapes (`ESC` then intermediates and a final character:
charset choices, keypad modes, cursor saves), and control characters but tab, newline and
carriage return. A terminal's `\\r\\n` line ends become `\\n`; a lone `\\r` stays (a progress
bar's redraws stay visible as such). A sequence cut at the end of the text is removed too; its
rest, at the start of the next read, then shows as text: read with `since` from a line start
when that matters.
"""

from __future__ import annotations

import re

_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"  # CSI: parameters, intermediates, final
    r"|\x1b[\]PX^_][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # strings, to their terminator
    r"|(?:\x1b\[|\x9b)[0-?]*[ -/]*\Z"  # a CSI cut at the end
    r"|\x1b[ -/]*[0-~]"  # other escapes
    r"|\x1b[ -/]*\Z"  # an escape cut at the end
    r"|[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f]"  # controls but \t \n \r (and ESC: above)
    r"|\x1b"  # a stray ESC
)

# A terminal ends lines with \r\n, and a program's own \r\n becomes \r\r\n on the way.
_LINE_END = re.compile(r"\r+\n")


def strip_escapes(text: str) -> str:
    """`text` without terminal escape sequences and control characters, `\\r\\n` as `\\n`.
    Linear in the length of `text`."""
    return _LINE_END.sub("\n", _ESCAPES.sub("", text))
