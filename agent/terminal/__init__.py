"""`toolsd agent`: the terminal front end (the command, what it shows, the prompt's keys,
stdin's lines). Above turns."""
