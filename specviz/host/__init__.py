"""The machine this process runs on: CPUs and torch's threads (`cpus`), the description recorded beside every
figure (`machine`), a long-running server's memory (`memory`) and the app's one compute thread (`compute`).
Imports the top-level modules only.
"""
