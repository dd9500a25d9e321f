"""What a session can do: shell.run, repl.exec, the process.* methods, image.read, and the bounded views of their output."""
