"""Diagnostics after edits, from language servers run in the session. Above calls."""
