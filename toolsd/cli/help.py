"""How every subcommand's --help reads: each option with what it does and its default.

An option whose help does not already say its default gets "(default: X)" added, from the
parser itself, so the two can never disagree. Flags (store_true) and options without a
default say nothing more: off, and absent, are what leaving them out means."""

from __future__ import annotations

import argparse


class DefaultsFormatter(argparse.HelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or not action.option_strings:
            return text
        default = action.default
        if isinstance(default, bool) or default in (None, "", [], argparse.SUPPRESS):
            return text
        shown = f"{default:g}" if isinstance(default, float) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


class ToolsdParser(argparse.ArgumentParser):
    """The parser of each subcommand (main.py's `parser_class`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)
