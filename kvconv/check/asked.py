"""Asked for, not done, is said: what the user asked a run to check (``kvconv record --writes``, ``--engine``, the
value probe ``KVCONV_VALUE=1``, the location canary ``KVCONV_CANARY=1``: the dump's ``metadata.asked``, written by
the tracer and by the engine plugins) against the records that show each check ran.

A dump is judged on what its producer makes (the tracer: slot writes, and the engine's steps when it records
writes; a plugin's probe dump: steps, value digests, canary records): an ask it left unchecked is an
``asked-unchecked`` warning, every one of them ``asked-nothing-checked`` (the verdict nothing-checked). A run (all
its dumps: :mod:`kvconv.check.runs`) is judged on all of them: an ask no dump of it checked is a finding of the run
(:func:`of_run`), which :func:`kvconv.check.verdict.of_run` judges with the dumps' verdicts.

    >>> asks({"asked": {"writes": True, "engine": "sglang", "value": False, "capture_range": "profiler"}})
    {'writes': True, 'engine': 'sglang'}
    >>> [f.code for f in of_run([Asked({"writes": True}, frozenset(), True)])]
    ['asked-nothing-checked']
"""

from __future__ import annotations

from dataclasses import dataclass

from kvconv.format.findings import Finding

# each ask: how it is named, and what shows its check ran
WHAT = {"writes": "--writes (the write-address canary)", "engine": "--engine {v} (the plugin's steps)",
        "value": "the value probe (KVCONV_VALUE=1)", "canary": "the location canary (KVCONV_CANARY=1)"}
MISSING = {"writes": "no slot-write record of a registered cache", "engine": "no step of the engine's plugin",
           "value": "no value digest", "canary": "no location-canary record"}
TRACER = ("writes", "engine")  # what the tracer's dump holds (the engine's steps only when it records writes)
PROBE = ("engine", "value", "canary")  # what a plugin's probe dump holds


@dataclass(frozen=True)
class Asked:
    """One dump's asks (name -> what was asked), the asks whose records it holds, and whether the tracer wrote it."""

    asked: dict
    held: frozenset
    tracer: bool

    @property
    def served(self) -> tuple[str, ...]:
        """The asks this dump's producer answers in it."""
        if not self.tracer:
            return PROBE
        return TRACER if self.asked.get("writes") else ()


def asks(meta: dict) -> dict:
    """What a dump's metadata says was asked (the checks: writes, engine, value, canary; those asked only). A probe
    dump written before the plugins recorded it: the engine it names."""
    a = meta.get("asked")
    if isinstance(a, dict):
        return {k: v for k, v in a.items() if k in WHAT and v}
    if str(meta.get("producer", "")).startswith("kvconv.capture.engines") and meta.get("engine"):
        return {"engine": meta["engine"]}
    return {}


def of_dump(d) -> Asked:
    """A readable dump's asks and the records it holds of each."""
    try:
        meta = d.metadata() or {}
    except Exception:  # noqa: BLE001 - unreadable metadata is the metadata pass's finding
        meta = {}
    meta = meta if isinstance(meta, dict) else {}

    def n(kind: str) -> int:
        return sum(len(g.records) for g in d.groups_of(kind))

    held = {k for k, ok in (("writes", n("slot_write") and n("cache")), ("engine", n("write_step")),
                            ("value", n("value_digest")), ("canary", n("canary"))) if ok}
    return Asked(asks(meta), frozenset(held), meta.get("tool") == "kvconv-tracer")


def findings(d, a: Asked) -> list[Finding]:
    """The dump's own: each ask its producer answers and it holds no record of."""
    mine = [k for k in a.served if k in a.asked]
    unmet = [k for k in mine if k not in a.held]
    if not unmet:
        return []
    mg = d.groups_of("metadata")
    where = {"path": d.path, "group": mg[0].index if mg else None, "offset": mg[0].payload_offset if mg else None,
             "field": "metadata.asked"}
    if len(unmet) == len(mine):
        return [Finding("warning", "asked-nothing-checked", "nothing of what was asked was checked here: "
                        + "; ".join(_said(k, a.asked[k], "this dump") for k in unmet), **where)]
    return [Finding("warning", "asked-unchecked", _said(k, a.asked[k], "this dump") + ": not checked", **where)
            for k in unmet]


def of_run(dumps: list[Asked]) -> list[Finding]:
    """The run's own findings: each ask of any of its dumps that none of them holds a record of
    (``asked-nothing-checked`` when that is every ask of the run)."""
    asked: dict = {}
    for a in dumps:
        for k, v in a.asked.items():
            asked.setdefault(k, v)
    held = set().union(*(a.held for a in dumps)) if dumps else set()
    unmet = [k for k in asked if k not in held]
    if not unmet:
        return []
    where = _run_words(dumps)
    if len(unmet) == len(asked):
        return [Finding("warning", "asked-nothing-checked", "nothing of what was asked was checked in the run: "
                        + "; ".join(_said(k, asked[k], where, dumps) for k in unmet))]
    return [Finding("warning", "asked-unchecked", _said(k, asked[k], where, dumps) + ": not checked")
            for k in unmet]


def _run_words(dumps: list[Asked]) -> str:
    return "its dump" if len(dumps) == 1 else f"any of its {len(dumps)} dumps"


def _said(k: str, v, where: str, dumps: list[Asked] | None = None) -> str:
    why = MISSING[k]
    if k == "engine" and dumps is not None and all(a.tracer for a in dumps):
        why = "no probe dump of the plugin found in the run"
        where = ""
    return f"{WHAT[k].format(v=v)} was asked: {why}" + (f" in {where}" if where else "")
