"""The wire contract, shared by the client and the daemon: messages, frames, socket path."""
