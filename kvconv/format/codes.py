"""The registry of finding and error codes (``schemas/codes.json``): every code kvconv can report, its severities,
whether it makes a dump unreadable, and what it means and what to do (docs/FINDINGS.md is generated from it).

    >>> from kvconv.format import codes
    >>> codes.CODES["bad-magic"].unreadable, codes.CODES["coverage-late"].severity
    (True, ('warning', 'error'))
    >>> "truncated-payload" in codes.UNREADABLE
    True

A new check picks its code here first: tests/test_codes.py fails on a code the source or a fixture's output uses
that the registry lacks, and on a registry entry nothing uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvconv.format.layout import load_json_schema

AREAS = {  # docs/FINDINGS.md sections, in order
    "input": "Opening a file",
    "structure": "Structure (every command that reads a dump)",
    "validate": "Schema and semantics (kvconv validate)",
    "reconcile": "Reconciliation (kvconv reconcile, validate)",
    "canary": "Location canary (kvconv canary, validate)",
    "output": "Outputs (perfetto, chrome, arrow, record -o)",
    "usage": "Options",
    "record": "kvconv record",
    "generic": "Generic codes",
}


@dataclass(frozen=True)
class Code:
    code: str
    severity: tuple[str, ...]  # the levels it can have, usual first
    unreadable: bool  # an error after which the file cannot be read as a whole (validate exits 2)
    area: str
    means: str
    do: str
    incomplete: bool = False  # with no error, the verdict is incomplete (not finished, or cut short and salvaged)


def _load() -> dict[str, Code]:
    out = {}
    for name, c in load_json_schema("codes.json")["codes"].items():
        if c["area"] not in AREAS:
            raise AssertionError(f"schemas/codes.json: {name}: unknown area {c['area']!r}")
        out[name] = Code(code=name, severity=tuple(c["severity"]), unreadable=bool(c["unreadable"]), area=c["area"],
                         means=c["means"], do=c["do"], incomplete=bool(c.get("incomplete", False)))
    return out


CODES: dict[str, Code] = _load()
UNREADABLE: frozenset[str] = frozenset(k for k, c in CODES.items() if c.unreadable)
INCOMPLETE: frozenset[str] = frozenset(k for k, c in CODES.items() if c.incomplete)
