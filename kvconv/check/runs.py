"""One run: every dump it wrote. An engine's front end, its scheduler or workers each trace into a dump of their own
(docs/TRACER.md, "An engine's processes": ``-o run.kvdump`` for the first process, ``run.pid<N>.kvdump`` for the
others, or the ``%p`` pattern's names), and kvconv's engine plugins write their probe dumps beside them
(``run.<engine>-<pid>.probe.kvdump``: :func:`probe_path`). :func:`find` finds a run's files from its ``-o`` path or
its dumps (kvconv record, ``kvconv.open``, validate, report and diff ask it); :func:`groups` links dumps into runs by
their processes; the verdict of a run is :func:`kvconv.check.verdict.of_run`'s.

    >>> set_exit([4, 0]), set_exit([4, 4]), set_exit([4, 1]), set_exit([0, 5]), set_exit([5, 1])
    (0, 4, 1, 5, 1)
    >>> linked([{"pid": 10, "ppid": 1, "hostname": "h"}, {"pid": 11, "ppid": 10, "hostname": "h"}])
    True
    >>> linked([{"pid": 10, "ppid": 1, "hostname": "h"}, {"pid": 12, "ppid": 2, "hostname": "h"}])
    False
    >>> probe_path("runs/run-%p.kvdump", 42, engine="vllm")
    'runs/run-42.vllm-42.probe.kvdump'
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

ENGINES = ("vllm", "sglang")  # the plugins that write probe dumps (kvconv.capture.engines)
COMPRESSED = (".zst", ".xz")  # what the reader decompresses (a fixture's dumps keep their run's names before it)
_PROBE = re.compile(r"\.(?:" + "|".join(ENGINES) + r")-(\d+)\.probe\.kvdump$")


def probe_path(tracer_output: str | None, pid: int, *, engine: str) -> str:
    """The probe dump an engine plugin writes under ``kvconv record``: beside the tracer's (``-o``, its %p and %c
    filled in), named after it; ``./kvconv-<engine>-<pid>.probe.kvdump`` without a tracer output."""
    if not tracer_output:
        return os.path.abspath(f"kvconv-{engine}-{pid}.probe.kvdump")
    base = tracer_output.replace("%p", str(pid)).replace("%c", "0")
    base = base[: -len(".kvdump")] if base.endswith(".kvdump") else base
    return f"{base}.{engine}-{pid}.probe.kvdump"


def pattern_glob(output: str) -> str:
    """The glob of every name an output pattern can give (%p, %c: any; %%: a %)."""
    out, i = [], 0
    while i < len(output):
        if output[i] == "%" and i + 1 < len(output) and output[i + 1] in "pc%":
            out.append("*" if output[i + 1] != "%" else "%")
            i += 2
        else:
            out.append(glob.escape(output[i]))
            i += 1
    return "".join(out)


def globs(output: str) -> tuple[list[str], list[str]]:
    """The globs of a run's files from its ``-o`` path: (tracer dumps, probe dumps). A literal path: itself and the
    ``<stem>.pid<N><ext>`` names of the processes other than the first (native/src/config.cpp); a pattern: its
    names. Probe dumps: :func:`probe_path` of any pid. A compressed name (``run.kvdump.zst``) keeps its suffix."""
    zip_ext = next((z for z in COMPRESSED if output.endswith(z)), "")
    plain = output[: len(output) - len(zip_ext)]
    first = pattern_glob(plain)
    tracer = [first + glob.escape(zip_ext)]
    if first == glob.escape(plain):
        folder, name = os.path.split(plain)
        stem, ext = os.path.splitext(name) if not name.startswith(".") else (name, "")
        tracer.append(os.path.join(glob.escape(folder), glob.escape(stem) + ".pid[0-9]*" + glob.escape(ext + zip_ext)))
    base = plain.replace("%c", "0")
    base = base[: -len(".kvdump")] if base.endswith(".kvdump") else base
    probes = [pattern_glob(base) + f".{e}-[0-9]*.probe.kvdump" + glob.escape(zip_ext) for e in ENGINES]
    return tracer, probes


def find(paths: list[str], *, meta=None) -> list[str]:
    """Every file of the runs named by ``paths`` (a run's ``-o`` path, literal or with %p, or its dumps): each path
    that is a file, and the files named after it (:func:`globs`) whose processes are linked to it (:func:`groups`:
    pid, ppid, the output's owner; a probe dump's pid from its name where its metadata has none). A pattern that is
    no file: every file of its names. The paths named are kept as named (in order); each file found is added once.

        >>> find(["fixtures/h200-engine-procs/range-profiler.kvdump.zst"])   # doctest: +SKIP
        ['.../range-profiler.kvdump.zst', '.../range-profiler.pid959.kvdump.zst']

    Args:
        paths: the paths named.
        meta: ``meta(path)``: a file's metadata (``{}``: none), where the caller holds the file open
            (:func:`kvconv.run.open`: the run's own open dumps); None: each file opened here for it.

    Returns:
        The paths named, then the files found beside them.
    """
    paths = [str(p) for p in paths]
    out: list[str] = []
    found: list[str] = []  # the files found beside them, after the paths named
    for p in paths:
        named: list[str] = []
        for base in dict.fromkeys([p, output_of(p)]):
            tracer, probes = globs(base)
            named += [f for g in tracer + probes for f in sorted(glob.glob(g)) if f not in named and ".tmp." not in f
                      and os.path.isfile(f) and (f == p or not _is_probe(f) or g in probes)]
        others = [f for f in named if f != p]
        if os.path.isfile(p) and others:
            others = _linked_to(p, others, meta)
        if os.path.isfile(p) or not others:  # a dump, "-" (stdin), a path that is not there: itself, as named
            out.append(p)
        found += [f for f in others if f not in found]
    return out + [f for f in found if f not in out and f not in paths]


def output_of(path: str) -> str:
    """The ``-o`` path a run's file was named after: ``run.pid<N>.kvdump`` and ``run.<engine>-<pid>.probe.kvdump``
    -> ``run.kvdump`` (a compressed name keeps its suffix); any other name is its own.

        >>> output_of("o/run.pid42.kvdump.zst"), output_of("o/run.vllm-42.probe.kvdump"), output_of("o/x.kvdump")
        ('o/run.kvdump.zst', 'o/run.kvdump', 'o/x.kvdump')
    """
    z = next((z for z in COMPRESSED if path.endswith(z)), "")
    plain = path[: len(path) - len(z)]
    m = _PROBE.search(plain)
    if m:
        return plain[: m.start()] + ".kvdump" + z
    folder, name = os.path.split(plain)
    m = re.fullmatch(r"(.+)\.pid\d+((?:\.[^.]*)?)", name)
    return os.path.join(folder, m.group(1) + m.group(2)) + z if m else path


def _is_probe(path: str) -> bool:
    name = path[: -len(z)] if (z := next((z for z in COMPRESSED if path.endswith(z)), "")) else path
    return _PROBE.search(name) is not None


def _linked_to(path: str, named: list[str], meta=None) -> list[str]:
    """The files of ``named`` in the same run as the dump at ``path`` (``meta``: :func:`find`'s)."""
    procs = [process(f, meta(f) if meta is not None else None) for f in [path, *named]]
    for g in groups(procs):
        if 0 in g:
            return [named[i - 1] for i in sorted(g) if i]
    return []


def process(path: str, meta: dict | None = None) -> dict:
    """The process a dump came from (:func:`kvconv.format.info.process_of`; ``meta``: its metadata, already read);
    a probe dump whose metadata names none (written before the plugins recorded it): the pid of its name."""
    import warnings

    from kvconv.format.info import process_in, process_of

    if meta is not None:
        proc = process_in(meta)
    else:
        with warnings.catch_warnings():  # an unfinished dump's warning is its validation's to say, once
            warnings.simplefilter("ignore")
            proc = process_of(path)
    if proc.get("pid") is None:
        m = _PROBE.search(path[: -len(z)] if (z := next((z for z in COMPRESSED if path.endswith(z)), "")) else path)
        if m:
            proc = dict(proc, pid=int(m.group(1)))
    return proc


def groups(procs: list[dict]) -> list[set[int]]:
    """The runs among some dumps' processes (metadata: pid, ppid, hostname, output_owner_pid), as sets of indices:
    dumps of one host joined through parent links, the owner of a shared output path, or one pid (a process's
    tracer dump and its plugin's probe dump). A dump without a pid is a run of its own; a missing hostname matches
    any."""
    out: list[set[int]] = []
    for i, p in enumerate(procs):
        near = [g for g in out if any(_near(p, procs[j]) for j in g)]
        merged = {i}.union(*near)
        out = [g for g in out if g not in near] + [merged]
    return sorted(out, key=min)


def _near(a: dict, b: dict) -> bool:
    if a.get("pid") is None or b.get("pid") is None:
        return False
    if a.get("hostname") and b.get("hostname") and a["hostname"] != b["hostname"]:
        return False
    ia, ib = _ids(a), _ids(b)
    return int(a["pid"]) == int(b["pid"]) or int(a["pid"]) in ib or int(b["pid"]) in ia


def _ids(p: dict) -> set[int]:
    """The pids a process names: its parent, and the owner of the output path it shares."""
    out = {int(p["ppid"])} if p.get("ppid") is not None else set()
    owner = p.get("output_owner_pid")
    return out | ({int(owner)} if owner not in (None, "") else set())


def linked(procs: list[dict]) -> bool:
    """Whether processes (metadata: pid, ppid, hostname, output_owner_pid) are one run: one host, and each joined to
    the others through parent links or the owner of a shared output path."""
    if len(procs) < 2 or any(p.get("pid") is None for p in procs) or len({p.get("hostname") for p in procs}) > 1:
        return False
    return len(groups(procs)) == 1


# ---- the run's verdict: the one judge (kvconv.check.verdict.of_run) over each run among some dumps ----

@dataclass(frozen=True)
class Judged:
    """One run among some dumps: its dumps (indices), its one verdict and its own findings (what was asked and ran
    in none of its dumps)."""

    dumps: tuple[int, ...]
    verdict: str
    findings: list


def judge(paths: list[str], verdicts: list[str], asks: list | None = None, *, one: bool = False,
          per: list[set[int]] | None = None) -> list[Judged]:
    """Each run among some dumps (:func:`split`; ``one``: all of them, what one kvconv record ran; ``per``: the runs,
    when known) judged by :func:`kvconv.check.verdict.of_run` over its dumps' verdicts and what was asked and ran in
    none of its dumps (``asks``: each dump's :class:`kvconv.check.asked.Asked`, None where unknown). The verdict of
    them all: :func:`kvconv.check.verdict.worst` of theirs.

        >>> [(j.dumps, j.verdict) for j in judge(["a.kvdump"], ["nothing-checked"])]
        [((0,), 'nothing-checked')]
    """
    from kvconv.check import asked, verdict

    asks = asks if asks is not None else [None] * len(paths)
    out = []
    for g in per if per is not None else split(paths, one=one):
        idx = tuple(sorted(g))
        mine = asked.of_run([asks[i] for i in idx if asks[i] is not None])
        out.append(Judged(idx, verdict.of_run([verdicts[i] for i in idx], mine), mine))
    return out


def split(paths: list[str], *, one: bool = False, metas: list | None = None) -> list[set[int]]:
    """The runs among some dumps (:func:`groups` of their processes), as sets of indices; ``one``: all one run;
    ``metas``: their metadata where already read (None: read here; ``{}``: known to have none)."""
    if len(paths) < 2 or one:
        return [set(range(len(paths)))]
    metas = metas if metas is not None else [None] * len(paths)
    return groups([process(p, m) for p, m in zip(paths, metas)])


# ---- exit statuses: what the commands whose outcomes are exit statuses ask (a thin front of the one judge) ----

def set_exit(exits: list[int | None]) -> int:
    """One exit status over one run's processes (:func:`kvconv.check.verdict.of_run` of their verdicts); None: a
    dump not validated."""
    return _of([[e for e in exits if e is not None]])


def of_run(paths: list[str], exits: list[int], *, metas: list | None = None) -> int:
    """The exit status of several dumps: each run among them (:func:`groups`) judged as one
    (:func:`kvconv.check.verdict.of_run`), the worst run's; ``metas``: their metadata where already read from the
    open dump (:func:`split`)."""
    nothing = 4  # nothing-checked: the only verdict whose weight depends on which run a dump is of
    if len(exits) < 2 or nothing not in exits or all(e == nothing for e in exits):
        return _of([list(exits)])
    return _of([[exits[i] for i in g] for g in split(paths, metas=metas)])


def _of(runs: list[list[int]]) -> int:
    from kvconv.check.verdict import EXIT_CODES, of_run, worst

    names = {code: v for v, code in EXIT_CODES.items()}
    odd = [e for r in runs for e in r if e not in names]  # 3: kvconv's internal error, above any verdict
    if odd:
        return max(odd)
    return EXIT_CODES[worst(of_run([names[e] for e in r]) for r in runs)]
