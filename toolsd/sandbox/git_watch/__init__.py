"""What the host's git would execute that a session added to its workspace: git's config and
dirs read as git reads them, watched with one inotify instance."""
