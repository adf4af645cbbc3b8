"""The machine this process runs on: CPUs and torch's threads (`cpus`), a long-running server's memory (`memory`)
and the app's one compute thread (`compute`). Imports the lowest layer only (config).
"""
