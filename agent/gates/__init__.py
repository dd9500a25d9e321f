"""Whether a tool call runs: the approval modes and plan mode's refusal of writes. Above
calls (the tools' read-only marks)."""
