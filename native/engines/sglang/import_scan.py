"""Which third-party modules an unpacked SGLang bundle imports at module level, from given entry modules, and which of
them neither the bundle's site, the standard library nor the device image has: the bundle's drop lists checked
without torch or a GPU (the scan reads source, imports nothing).

Follows ``import``/``from`` statements at module level of every ``sglang`` module reached, transitively; imports
inside functions, under ``if`` (platform checks, ``TYPE_CHECKING``) or in a ``try`` with an ``except`` are left
out (SGLang guards optional ones so). Prints one line per missing top-level name with the chain that reaches it,
exits 1 if any.

    python3 import_scan.py /tmp/sglang-0.5.17/site --image image-packages.txt sglang.launch_server \\
        sglang.srt.entrypoints.engine sglang.srt.managers.scheduler
    missing xgrammar: sglang.srt.function_call.kimik3_detector <- sglang.srt.function_call.function_call_parser <- ...
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys

# distribution name -> import name, where they differ (image-packages.txt lists distributions)
IMPORT_NAMES = {"pillow": "PIL", "pyyaml": "yaml", "scikit-learn": "sklearn", "scikit-image": "skimage",
                "opencv-python-headless": "cv2", "nvidia-ml-py": "pynvml", "huggingface-hub": "huggingface_hub",
                "cuda-bindings": "cuda", "prometheus-client": "prometheus_client", "typing-extensions":
                "typing_extensions", "protobuf": "google", "python-dateutil": "dateutil"}


def module_file(site: str, name: str) -> str | None:
    """The source of module ``name`` under ``site`` (a package's ``__init__.py``), or None."""
    p = os.path.join(site, *name.split("."))
    if os.path.isfile(os.path.join(p, "__init__.py")):
        return os.path.join(p, "__init__.py")
    return p + ".py" if os.path.isfile(p + ".py") else None


def imports(source: str, name: str, is_package: bool) -> list[tuple[str, bool]]:
    """(module imported, guarded) of the module-level imports of ``source``; ``from X import y`` gives X and X.y."""
    out: list[tuple[str, bool]] = []

    def visit(body, guarded: bool) -> None:
        for n in body:
            if isinstance(n, ast.Try):
                visit(n.body, guarded or bool(n.handlers))
                for h in n.handlers:
                    visit(h.body, guarded)
                visit(n.orelse, guarded)
                visit(n.finalbody, guarded)
            elif isinstance(n, ast.If):
                visit(n.body, True)
                visit(n.orelse, True)
            elif isinstance(n, ast.Import):
                out.extend((a.name, guarded) for a in n.names)
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    parts = name.split(".") if is_package else name.split(".")[:-1]
                    parts = parts[:len(parts) - (n.level - 1)]
                    base = ".".join(parts + ([n.module] if n.module else []))
                out.append((base, guarded))
                out.extend((f"{base}.{a.name}", guarded) for a in n.names)

    visit(ast.parse(source).body, False)
    return out


def scan(site: str, roots: list[str]) -> dict[str, list[str]]:
    """Top-level third-party name -> the chain (importer first) of the first ``sglang`` module that needs it."""
    via: dict[str, str] = {}
    seen: set[str] = set()
    needed: dict[str, str] = {}
    stack = list(roots)
    while stack:
        name = stack.pop()
        f = module_file(site, name)
        if name in seen or f is None:
            continue
        seen.add(name)
        with open(f, encoding="utf-8") as fh:
            found = imports(fh.read(), name, f.endswith("__init__.py"))
        for mod, guarded in found:
            top = mod.split(".")[0]
            if guarded:
                continue
            if top != "sglang":
                needed.setdefault(top, name)
                continue
            parts = mod.split(".")
            for i in range(1, len(parts) + 1):
                sub = ".".join(parts[:i])
                if sub not in seen and module_file(site, sub):
                    via.setdefault(sub, name)
                    stack.append(sub)
    chains = {}
    for top, first in needed.items():
        chain = [first]
        while chain[-1] in via and len(chain) < 40:
            chain.append(via[chain[-1]])
        chains[top] = chain
    return chains


def available(site: str, image_list: str | None) -> set[str]:
    """Import names the bundle's site, the standard library and the image (its distribution list) provide."""
    have = set(sys.stdlib_module_names)
    have |= {re.sub(r"\.py$", "", e) for e in os.listdir(site) if not e.endswith((".dist-info", ".pth"))}
    if image_list:
        with open(image_list, encoding="utf-8") as fh:
            for row in fh:
                dist = row.split("#")[0].strip().lower()
                if dist:
                    have.add(IMPORT_NAMES.get(dist, dist.replace("-", "_")))
    return have


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("site", help="the unpacked bundle's site folder (unpack.sh's DEST/site)")
    ap.add_argument("roots", nargs="+", help="entry modules (sglang.launch_server, ...)")
    ap.add_argument("--image", help="the image's package list (image-packages.txt)")
    a = ap.parse_args(argv)
    have = available(a.site, a.image)
    missing = {t: c for t, c in sorted(scan(a.site, a.roots).items()) if t not in have}
    for top, chain in missing.items():
        print(f"missing {top}: {' <- '.join(chain)}")
    print(f"{len(missing)} missing", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
