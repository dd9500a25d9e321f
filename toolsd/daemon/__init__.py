"""The daemon: its socket and connections, the dispatch table, the supervisor, the sessions."""
