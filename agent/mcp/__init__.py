"""`toolsd mcp`: the agent's tools served to MCP clients. The top layer (it reads stdin
through terminal's line reader)."""
