"""Tool calls: the tools a model sees, their arguments and results, and where each call
goes (the toolsd session through the backend, ask_user, outside MCP servers). Above
history and models (a picture fitted to the provider's limits)."""
