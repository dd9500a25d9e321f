"""What a session runs in: the Sandbox object (session_sandbox.py) and the sandbox's own
errors (errors.py), on four subsystems, each a package that imports only the ones before it:
bwrap/ (what the session sees), git_watch/ (what the host's git would run), egress/ (what it
may reach), launch/ (what runs in it)."""
