"""Capture: ``record`` runs a command under the injected tracer; ``probe`` is the Python side that runs inside the
engine's process (canary snapshots around graph replays).

    $ kvconv record -o run.kvdump -- python serve.py
"""
