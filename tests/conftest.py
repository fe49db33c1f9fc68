"""Shared test plumbing: the real CLI as a subprocess, the --update-goldens switch, and GPU skipping."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


def load_script(path: Path, name: str | None = None):
    """Import a file that is not in a package (a fixture generator, a tool, a bench script) as a module, registered
    in ``sys.modules`` (dataclasses look their module up there)."""
    name = name or f"kvconv_script_{path.parent.name}_{path.stem}".replace("-", "_")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def pytest_addoption(parser):
    parser.addoption("--update-goldens", action="store_true", default=False,
                     help="rewrite the expected outputs of the golden cases under fixtures/ instead of comparing")


@pytest.fixture
def update_goldens(request) -> bool:
    return bool(request.config.getoption("--update-goldens"))


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, cwd: str | os.PathLike | None = None, env: dict | None = None, timeout: float = 300) -> Result:
    """Run ``python -m kvconv ARGS`` as a user would, and return its exit code and output."""
    e = dict(os.environ)
    e.pop("KVCONV_DEBUG", None)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e["COLUMNS"] = "200"
    # Progress lines on a non-terminal come every 2 s: on a loaded machine a command that fails after 2 s would add
    # one before its Error line. Tests of progress set their own interval.
    e["KVCONV_PROGRESS_INTERVAL"] = "3600"
    if env:
        e.update(env)
    p = subprocess.run([sys.executable, "-m", "kvconv", *map(str, args)], cwd=cwd, env=e, capture_output=True,
                       text=True, timeout=timeout)
    return Result(p.returncode, p.stdout, p.stderr)


@pytest.fixture
def cli():
    return run_cli


def track_paths(trace) -> dict[int, str]:
    """A Perfetto trace's track uuid -> "root / child / ... / track" from its track descriptors (what the UI nests)."""
    descs = {p.track_descriptor.uuid: p.track_descriptor for p in trace.packet if p.HasField("track_descriptor")}

    def path(u):
        names = []
        while u in descs:
            names.append(descs[u].name)
            u = descs[u].parent_uuid if descs[u].HasField("parent_uuid") else None
        return " / ".join(reversed(names))

    return {u: path(u) for u in descs}
