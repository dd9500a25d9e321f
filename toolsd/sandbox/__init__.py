"""What a session runs in: the bwrap policy, the launcher channel, the host-side process tools."""
