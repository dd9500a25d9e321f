"""What a session sees: its sandbox policy, the mounts and the bubblewrap argv that enforce
it, the homes shown deny-by-default, the workspace rules and the watch on its hiding mounts.
Below launch/, which runs what these plan."""
