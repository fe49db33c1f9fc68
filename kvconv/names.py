"""Kernel names a person reads: a mangled C++ symbol (``_Z...``, the Itanium ABI) demangled for human-facing text
(``kvconv info``, ``validate``, ``canary``, ``reconcile``, the report), kept as it is in ``--json`` and the Arrow
tables (a name is a key there: the mangled one is what the driver and the tracer's ``-k`` match).

    >>> demangle("_Z3fooi")                                    # doctest: +SKIP
    'foo(int)'
    >>> demangle("reshape_and_cache_flash_kernel")             # not mangled: as it is
    'reshape_and_cache_flash_kernel'
    >>> demangle_text("kernel '_Z3fooi' grid 1x1x1")           # doctest: +SKIP
    "kernel 'foo(int)' grid 1x1x1"

The demangler is libstdc++'s ``abi::__cxa_demangle`` through the ``cxxfilt`` package (made for it); without it, the
``c++filt`` program when one is on PATH; without either, and for a name neither can read, the name as it is.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess

# a mangled symbol's characters (Itanium ABI: identifiers, digits, '_'; clones add '.' suffixes, '$' in some)
_MANGLED = re.compile(r"(?<![A-Za-z0-9_$])_Z[A-Za-z0-9_$.]+")


@functools.lru_cache(maxsize=1)
def _backend():
    """A function mangled -> demangled (raising on a name it cannot read), or None. Imported on the first mangled
    name only: cxxfilt looks for libstdc++ at its import (ctypes.util.find_library), which takes time."""
    try:
        import cxxfilt

        return cxxfilt.demangle
    except Exception:  # noqa: BLE001 - no package, or no libstdc++ to load: try the program
        pass
    exe = shutil.which("c++filt")
    if exe is None:
        return None

    def run(name: str) -> str:
        out = subprocess.run([exe, "--", name], capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        if not out or out == name:
            raise ValueError(name)
        return out

    return run


@functools.lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """``name`` demangled when it is a mangled C++ symbol, else ``name``."""
    if not name.startswith("_Z"):
        return name
    fn = _backend()
    if fn is None:
        return name
    try:
        out = fn(name)
    except Exception:  # noqa: BLE001 - not a name the demangler reads: as it is
        return name
    return out or name


def demangle_text(text: str) -> str:
    """Every mangled symbol in a line of human-facing text demangled (the rest unchanged)."""
    if "_Z" not in text:
        return text
    return _MANGLED.sub(lambda m: demangle(m.group(0)), text)
