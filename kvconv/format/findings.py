"""Findings: what validate, reconcile and canary report, one object per problem.

    >>> from kvconv.format.findings import Finding
    >>> f = Finding("error", "sequence-gap", "sequence jumps from 9 to 12", path="d.bin", group=1, record=10,
    ...             offset=768, field="device_event.sequence")
    >>> f.line()
    'error sequence-gap d.bin: byte 768: group 1 record 10: device_event.sequence: sequence jumps from 9 to 12'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvconv.wording import counted

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    severity: str
    code: str
    message: str
    path: str | None = None
    group: int | None = None
    record: int | None = None
    offset: int | None = None
    field: str | None = None
    count: int = 1  # how many records share this finding (the first is named)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")

    def where(self) -> list[str]:
        """Where it is, as its line names it: path, byte offset, group and record, field (those known)."""
        where = []
        if self.path is not None:
            where.append(str(self.path))
        if self.offset is not None:
            where.append(f"byte {self.offset}")
        if self.group is not None:
            where.append(f"group {self.group}" + (f" record {self.record}" if self.record is not None else ""))
        if self.field is not None:
            where.append(self.field)
        return where

    def line(self) -> str:
        more = f" ({counted(self.count, 'record')})" if self.count > 1 else ""
        return f"{self.severity} {self.code} " + ": ".join(self.where() + [self.message + more])

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_error(cls, err, severity: str = "error") -> Finding:
        """A finding from a :class:`kvconv.format.errors.KvconvError`."""
        return cls(
            severity,
            err.code,
            err.message if not err.hint else f"{err.message} ({err.hint})",
            path=err.path,
            group=err.group,
            record=err.record,
            offset=err.offset,
            field=err.field,
        )


def worst(findings) -> str | None:
    """The most severe level present, or None."""
    levels = {f.severity for f in findings}
    for s in SEVERITIES:
        if s in levels:
            return s
    return None
