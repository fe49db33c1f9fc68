"""The engine bundles' tools where no GPU is: native/engines/unpack.sh on a small bundle made the way
native/engines/vllm/bundle.sh makes one (a tar.xz of site/ and wheels/, split, SHA256SUMS with size comments), and
native/engines/vllm/wheels.py (the lock filter, the stored re-zip). The vLLM bundle itself is built and run by hand
(native/engines/README.md, vLLM); its seed script's arguments are checked here."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UNPACK = ROOT / "native" / "engines" / "unpack.sh"
WHEELS = ROOT / "native" / "engines" / "vllm" / "wheels.py"
SEED = ROOT / "native" / "workloads" / "vllm_seed.py"


def _wheel(path: Path, name: str, body: str) -> None:
    """A minimal valid wheel of one module `name` whose `VALUE` is body, deflated like PyPI's."""
    files = {
        f"{name}.py": f"VALUE = {body!r}\n",
        f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{name}-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{n},sha256={_b64(hashlib.sha256(t.encode()).digest())},{len(t.encode())}" for n, t in files.items()]
    files[f"{name}-1.0.dist-info/RECORD"] = "\n".join(record + [f"{name}-1.0.dist-info/RECORD,,"]) + "\n"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n, t in files.items():
            z.writestr(n, t)


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _bundle(tmp: Path, part_size: int) -> Path:
    """tar.xz of site/treepkg.py, wheels/wheelpkg-1.0-py3-none-any.whl and MANIFEST, split; returns the PREFIX."""
    whl = tmp / "wheelpkg-1.0-py3-none-any.whl"
    _wheel(whl, "wheelpkg", "from-wheel" + "x" * 4000)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as t:
        for arc, data in [("MANIFEST", b"test\n"), ("site/treepkg.py", b"VALUE = 'from-tree'\n"),
                          (f"wheels/{whl.name}", whl.read_bytes())]:
            info = tarfile.TarInfo(arc)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    blob, stage = buf.getvalue(), tmp / "stage"
    stage.mkdir()
    sums = []
    for i in range(0, len(blob), part_size):
        part = stage / f"b.part{i // part_size:02d}"
        part.write_bytes(blob[i : i + part_size])
        sums.append(f"{hashlib.sha256(part.read_bytes()).hexdigest()}  {part.name}")
    sizes = [f"# {p.name} {p.stat().st_size} bytes" for p in sorted(stage.glob("b.part*"))]
    (stage / "SHA256SUMS").write_text("\n".join(sizes + sums) + "\n")
    return stage / "b"


def _unpack(prefix: Path, dest: Path) -> subprocess.CompletedProcess:
    # unpack.sh calls `python3`: this interpreter (it has pip), first on PATH
    bindir = dest.parent / "bin"
    bindir.mkdir(exist_ok=True)
    if not (bindir / "python3").exists():
        (bindir / "python3").symlink_to(sys.executable)
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(["bash", str(UNPACK), str(prefix), str(dest)], capture_output=True, text=True, env=env,
                          timeout=120)


def test_unpack_installs_tree_and_wheels(tmp_path):
    prefix = _bundle(tmp_path, 256)
    assert len(list(prefix.parent.glob("b.part*"))) >= 2
    r = _unpack(prefix, tmp_path / "dest")
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith(f"export PYTHONPATH={tmp_path / 'dest' / 'site'}")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "dest" / "site"))
    out = subprocess.run([sys.executable, "-c", "import treepkg, wheelpkg; print(treepkg.VALUE, wheelpkg.VALUE[:10])"],
                         capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["from-tree", "from-wheel"]
    assert (tmp_path / "dest" / ".complete").exists()


def test_unpack_refuses_missing_cut_and_extra_parts(tmp_path):
    prefix = _bundle(tmp_path, 256)
    part1 = prefix.parent / "b.part01"
    saved = part1.read_bytes()
    part1.unlink()
    r = _unpack(prefix, tmp_path / "dest")
    assert r.returncode == 1 and "b.part01: missing (SHA256SUMS names it)" in r.stderr
    part1.write_bytes(saved[:-1])
    r = _unpack(prefix, tmp_path / "dest")
    assert r.returncode == 1
    assert r.stderr.strip() == f"unpack.sh: {part1}: sha256 differs from SHA256SUMS (cut short in transfer?)"
    part1.write_bytes(saved)
    (prefix.parent / "b.part99").write_bytes(b"stray")
    r = _unpack(prefix, tmp_path / "dest")
    assert r.returncode == 1 and "differ from SHA256SUMS" in r.stderr
    assert not (tmp_path / "dest").exists()


def test_unpack_keeps_a_foreign_folder(tmp_path):
    prefix = _bundle(tmp_path, 1 << 20)
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "keep.txt").write_text("x")
    r = _unpack(prefix, dest)
    assert r.returncode == 1 and "not an earlier unpack" in r.stderr
    assert (dest / "keep.txt").exists()
    assert _unpack(prefix, tmp_path / "fresh").returncode == 0
    assert _unpack(prefix, tmp_path / "fresh").returncode == 0  # its own earlier unpack is replaced


def test_wheels_filter_keeps_what_the_image_lacks(tmp_path):
    resolved = tmp_path / "resolved.txt"
    resolved.write_text("# header\naiohttp==3.1 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n"
                        "Pydantic_Core==2.5 \\\n    --hash=sha256:cc\nz3-solver==4.1\nvllm==0.26.0\n")
    image = tmp_path / "image.txt"
    image.write_text("# image\naiohttp\n")
    r = subprocess.run([sys.executable, str(WHEELS), "filter", str(resolved), str(image), "^(vllm|z3-solver)$"],
                       capture_output=True, text=True, check=True)
    assert r.stdout == "Pydantic_Core==2.5 --hash=sha256:cc\n"


def test_wheels_restore_stores_and_stays_installable(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    _wheel(src / "wheelpkg-1.0-py3-none-any.whl", "wheelpkg", "y" * 4000)
    lock = tmp_path / "wheels.lock"
    lock.write_text("wheelpkg==1.0 --hash=sha256:00\n")
    subprocess.run([sys.executable, str(WHEELS), "restore", str(lock), str(src), str(dst)], check=True)
    with zipfile.ZipFile(dst / "wheelpkg-1.0-py3-none-any.whl") as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}
        assert z.read("wheelpkg.py") == zipfile.ZipFile(src / "wheelpkg-1.0-py3-none-any.whl").read("wheelpkg.py")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site),
                    str(dst / "wheelpkg-1.0-py3-none-any.whl")], check=True, capture_output=True)
    assert (site / "wheelpkg.py").read_text() == f"VALUE = {'y' * 4000!r}\n"
    lock.write_text("wheelpkg==1.0 --hash=sha256:00\nother==2.0 --hash=sha256:11\n")
    r = subprocess.run([sys.executable, str(WHEELS), "restore", str(lock), str(src), str(dst)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "no wheel for other==2.0" in r.stderr


def test_seed_script_arguments_and_missing_vllm():
    r = subprocess.run([sys.executable, str(SEED), "--tp", "0"], capture_output=True, text=True)
    assert r.returncode == 2 and "--tp must be >= 1, not 0" in r.stderr
    r = subprocess.run([sys.executable, str(SEED), "--help"], capture_output=True, text=True, check=True)
    for opt in ("--requests", "--tokens", "--in-process", "--tp", "--compile-cache"):
        assert opt in r.stdout
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-S", str(SEED), "--in-process"], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and r.stderr.startswith("vllm_seed.py: cannot import vllm")


SCAN = ROOT / "native" / "engines" / "sglang" / "import_scan.py"


def test_import_scan_names_a_module_level_import_the_bundle_lacks_with_its_chain(tmp_path):
    site = tmp_path / "site"
    files = {
        "sglang/__init__.py": "from .srt import args\n",
        "sglang/srt/__init__.py": "",
        "sglang/srt/args.py": "import json\nfrom sglang.srt.parsers import kimi\n",
        "sglang/srt/parsers/__init__.py": "",
        "sglang/srt/parsers/kimi.py": ("from xgrammar import StructuralTag\nimport numpy\n"
                                       "try:\n    import outlines\nexcept ImportError:\n    outlines = None\n"
                                       "if False:\n    import torch_npu\n"
                                       "def lazy():\n    import soundfile\n"),
        "numpy/__init__.py": "",
    }
    for name, text in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    r = subprocess.run([sys.executable, str(SCAN), str(site), "sglang"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert r.stdout.splitlines() == ["missing xgrammar: sglang.srt.parsers.kimi <- sglang.srt.args <- sglang"]
    (site / "xgrammar.py").write_text("")
    r = subprocess.run([sys.executable, str(SCAN), str(site), "sglang"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "" and "0 missing" in r.stderr
