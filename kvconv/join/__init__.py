"""The launch table and the joins it stands on, below both the checks and the emitters: one context's host launch
records as columns (:mod:`~kvconv.join.launches`), its device events loaded and walked in chunks
(:mod:`~kvconv.join.events`), the runs of one launch's events (:mod:`~kvconv.join.runs`), the exact join of device
events to host launches (:mod:`~kvconv.join.exact`), the block pairing and launch durations
(:mod:`~kvconv.join.durations`), and a context's first pass over its events joined to its table
(:mod:`~kvconv.join.passes`: the emitters hand it the chunks and read what it returns). It imports neither
:mod:`kvconv.check` nor :mod:`kvconv.emit`.
"""

# The one vocabulary of the join, from the CLI (--join of reconcile, report, diff, perfetto, chrome, arrow) to the code
# (ReconcileOptions.join, EmitOptions.join, RunOptions.join): exact = by device gridid + tag; ordered = by sequence
# order (one stream); auto = exact where device events carry gridid (the converters: where it matches every event).
JOINS = ("auto", "exact", "ordered")
