"""A conversation kept: saved per workspace, listed, and what of it a request carries (the
window, compaction, the repository's context). Above history and models."""
