"""One run over several processes' dumps: an engine's front end, its scheduler or workers, each traced into a dump
of its own (docs/TRACER.md, "An engine's processes"). A process that ran no target kernel (exit 4 alone: nothing
checked) does not make such a run "nothing checked" when another of its processes was checked.

    >>> set_exit([4, 0]), set_exit([4, 4]), set_exit([4, 1]), set_exit([0, 5])
    (0, 4, 1, 5)
    >>> linked([{"pid": 10, "ppid": 1, "hostname": "h"}, {"pid": 11, "ppid": 10, "hostname": "h"}])
    True
    >>> linked([{"pid": 10, "ppid": 1, "hostname": "h"}, {"pid": 12, "ppid": 2, "hostname": "h"}])
    False
"""

from __future__ import annotations


def _nothing_checked() -> int:
    from kvconv.check.verdict import EXIT_CODES  # the one table (schemas/codes.json verdicts)

    return EXIT_CODES["nothing-checked"]


def set_exit(exits: list[int | None]) -> int:
    """One exit status over one run's processes: the worst over those that were checked; a process that ran no
    target kernel counts only when no process did."""
    known = [e for e in exits if e is not None]
    ran = [e for e in known if e != _nothing_checked()]
    return max(ran) if ran else max(known, default=0)


def of_run(paths: list[str], exits: list[int]) -> int:
    """The exit status of several dumps: the largest; the dumps of one run's processes (:func:`one_run`) as one
    (:func:`set_exit`)."""
    nothing = _nothing_checked()
    if len(exits) > 1 and nothing in exits and any(c != nothing for c in exits) and one_run(paths):
        return set_exit(exits)
    return max(exits, default=0)


def linked(procs: list[dict]) -> bool:
    """Whether processes (metadata: pid, ppid, hostname, output_owner_pid) are one run: one host, and each joined to
    the others through parent links or the owner of a shared output path."""
    if len(procs) < 2 or any(p.get("pid") is None for p in procs) or len({p.get("hostname") for p in procs}) > 1:
        return False
    pids = {int(p["pid"]) for p in procs}
    group = {int(procs[0]["pid"])}
    grew = True
    while grew:
        grew = False
        for p in procs:
            pid, ppid = int(p["pid"]), p.get("ppid")
            owner = p.get("output_owner_pid")
            near = {int(ppid)} if ppid is not None else set()
            near |= {int(owner)} if owner not in (None, "") else set()
            if pid not in group and (near & group or any(_parent(q) == pid for q in procs if int(q["pid"]) in group)):
                group.add(pid)
                grew = True
    return group == pids


def _parent(p: dict) -> int | None:
    return int(p["ppid"]) if p.get("ppid") is not None else None


def one_run(paths: list) -> bool:
    """Whether the dumps are one run's processes (their metadata linked: :func:`linked`). ``paths``: each a dump's
    process as :func:`kvconv.format.info.process_of` gives it (a dict: :attr:`kvconv.run.DumpRun.process`, read from
    the open dump), or an open dump, or a path (opened to read its metadata)."""
    from kvconv.format.info import process_of

    procs = []
    for p in paths:
        proc = p if isinstance(p, dict) else process_of(p)
        if not proc:
            return False
        procs.append(proc)
    return linked(procs)
