"""What runs in a session: the launcher (its code, its channel, its host processes),
spawning with pipes and terminals, jobs, process trees, cgroups, the file helper, the
daemon's connects, and the checks of what this machine offers the sandbox (doctor, probe)."""
