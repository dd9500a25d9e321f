"""trio helpers every layer uses (fd reads and writes, worker-thread pools)."""
