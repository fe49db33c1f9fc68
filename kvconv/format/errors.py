"""The kvconv exception family.

Every error carries where it happened, so the CLI can print one line that names the file, the byte offset and the
field, and tell the user what to do::

    >>> from kvconv.format.errors import FormatError
    >>> str(FormatError("bad magic", path="d.bin", offset=0, field="header.magic", hint="is this a kvconv dump?"))
    'd.bin: byte 0: header.magic: bad magic (is this a kvconv dump?)'
"""

from __future__ import annotations


class KvconvError(Exception):
    """Base class. ``code`` is a stable machine-readable name (e.g. ``bad-magic``)."""

    code = "error"
    exit_code = 1

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        group: int | None = None,
        record: int | None = None,
        offset: int | None = None,
        field: str | None = None,
        hint: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.group = group
        self.record = record
        self.offset = offset
        self.field = field
        self.hint = hint
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        parts = []
        if self.path is not None:
            parts.append(str(self.path))
        if self.offset is not None:
            parts.append(f"byte {self.offset}")
        if self.group is not None and self.record is not None:
            parts.append(f"group {self.group} record {self.record}")
        elif self.group is not None:
            parts.append(f"group {self.group}")
        if self.field is not None:
            parts.append(self.field)
        text = self.message if not self.hint else f"{self.message} ({self.hint})"
        return ": ".join(parts + [text])

    def to_dict(self) -> dict:
        return {
            "code": self.code,
            "message": self.message,
            "path": self.path,
            "group": self.group,
            "record": self.record,
            "offset": self.offset,
            "field": self.field,
            "hint": self.hint,
        }


class FormatError(KvconvError):
    """The bytes are not a readable kvconv dump (structure: magic, version, sizes, truncation)."""

    code = "format"
    exit_code = 2


class DamagedError(FormatError):
    """The file reads as a whole, but records in it are damaged (a payload checksum does not match): exit 1, as
    ``kvconv validate`` and ``info`` give for the same file (schemas/codes.json: ``payload-checksum`` is not
    ``unreadable``), not the 2 of a file that cannot be read."""

    exit_code = 1


class SchemaError(KvconvError):
    """A record, header or metadata value is outside what the schema allows."""

    code = "schema"


class OutputError(KvconvError):
    """An output cannot be written (would overwrite an input, directory missing, ...)."""

    code = "output"


class UsageError(KvconvError):
    """Options that do not fit together."""

    code = "usage"
    exit_code = 2
