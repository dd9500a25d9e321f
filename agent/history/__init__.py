"""The history of a conversation as the agent keeps it, provider-neutral: its messages
and the tool call ids unique in it. The lowest layer: imports nothing else of the agent's."""
