"""The turn loop and the Agent that runs turn after turn: its rules, approvals, undo,
steering, the offline queue, the config file. Above every layer but the front ends."""
