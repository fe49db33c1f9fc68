"""``kvconv info`` and ``kvconv validate``.

    $ kvconv info fixtures/qwen3-14b/qwen3-14b.kvdump
    $ kvconv validate fixtures/qwen3-14b/qwen3-14b.kvdump --json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List

import typer

from . import dump as dumpmod
from .errors import FormatError, SchemaError


def _print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def info_dict(d: dumpmod.Dump) -> dict:
    groups = []
    totals: dict[str, dict] = {}
    for g in d.groups:
        groups.append({
            "index": g.index,
            "offset": g.offset,
            "kind": g.kind_name,
            "major": g.major,
            "minor": g.minor,
            "record_size": g.record_size,
            "record_count": len(g.records) if g.kind and g.kind.layout else g.record_count,
            "capacity": g.capacity,
            "drop_count": g.drop_count,
            "lost_records": g.lost_records,
            "context_id": g.context_id,
            "device_id": g.device_id,
            "clock_domain": g.clock_domain_name,
            "payload_bytes": g.record_count * g.record_size,
        })
        t = totals.setdefault(g.kind_name, {"records": 0, "drops": 0, "groups": 0})
        t["records"] += groups[-1]["record_count"]
        t["drops"] += g.drop_count
        t["groups"] += 1
    try:
        meta = d.metadata()
        meta_error = None
    except SchemaError as e:
        meta, meta_error = None, str(e)
    out = {
        "path": d.path,
        "size": d.size,
        "groups": groups,
        "totals": totals,
        "contexts": [{"context_id": c, "device_id": v} for c, v in d.contexts()],
        "metadata": meta,
    }
    if meta_error:
        out["metadata_error"] = meta_error
    return out


def _info_text(info: dict) -> str:
    lines = []
    ver = {(g["major"], g["minor"]) for g in info["groups"]}
    vs = ", ".join(f"v{a}.{b}" for a, b in sorted(ver)) or "no groups"
    lines.append(f"{info['path']}: kvconv dump {vs}, {info['size']:,} bytes, {len(info['groups'])} groups, "
                 f"{len(info['contexts'])} context(s)")
    lines.append(f"{'group':>5} {'offset':>12} {'kind':<13} {'records':>11} {'capacity':>11} {'drops':>7} "
                 f"{'ctx':>4} {'dev':>4} clock")
    for g in info["groups"]:
        lost = f" (lost {g['lost_records']:,})" if g["lost_records"] else ""
        lines.append(f"{g['index']:>5} {g['offset']:>12,} {g['kind']:<13} {g['record_count']:>11,} "
                     f"{g['capacity']:>11,} {g['drop_count']:>7,} {g['context_id']:>4} {g['device_id']:>4} "
                     f"{g['clock_domain']}{lost}")
    tot = "; ".join(f"{k} {v['records']:,} ({v['drops']:,} dropped)" for k, v in info["totals"].items()
                    if k not in ("metadata", "strings"))
    lines.append(f"totals: {tot}")
    meta = info.get("metadata")
    if meta:
        keys = ("tool", "tool_version", "gpu", "driver", "model", "engine")
        lines.append("metadata: " + ", ".join(f"{k}={meta[k]}" for k in keys if k in meta))
        if isinstance(meta.get("counters"), dict):
            lines.append("counters: " + ", ".join(f"{k}={v!r}" for k, v in sorted(meta["counters"].items())))
    if info.get("metadata_error"):
        lines.append(f"metadata: unreadable ({info['metadata_error']})")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    register_demo(app)

    @app.command()
    def info(
        dumps: List[Path] = typer.Argument(..., help="dump file(s)", metavar="DUMP..."),
        as_json: bool = typer.Option(False, "--json", help="print JSON for machines"),
        salvage: bool = typer.Option(False, "--salvage", help="read a dump cut short up to its last whole record"),
    ) -> None:
        """Show a dump's record groups, counts, capacities, drops, clock domains and run metadata.

        Example: kvconv info fixtures/qwen3-14b/qwen3-14b.kvdump --json
        """
        opts = dumpmod.ReadOptions(salvage=salvage, verify_checksums=False)
        infos = []
        for p in dumps:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with dumpmod.open(p, options=opts) as d:
                    infos.append(info_dict(d))
        if as_json:
            _print_json(infos[0] if len(infos) == 1 else infos)
        else:
            sys.stdout.write("\n\n".join(_info_text(i) for i in infos) + "\n")

    @app.command()
    def validate(
        dumps: List[Path] = typer.Argument(..., help="dump file(s)", metavar="DUMP..."),
        as_json: bool = typer.Option(False, "--json", help="print every finding as JSON"),
        relaxed: bool = typer.Option(False, "--relaxed-reconcile",
                                     help="report reconciliation mismatches as warnings, not errors"),
        no_reconcile: bool = typer.Option(False, "--no-reconcile", help="skip the reconciler's checks"),
        salvage: bool = typer.Option(False, "--salvage", help="read a dump cut short up to its last whole record"),
    ) -> None:
        """Check structure, schema and semantics; report every problem. Exit 0 valid, 1 errors, 2 unreadable.

        Example: kvconv validate fixtures/qwen3-14b/qwen3-14b.kvdump
        """
        from .validate import ValidateOptions
        from .validate import validate as run_validate

        opts = ValidateOptions(reconcile=not no_reconcile, relaxed_reconcile=relaxed, salvage=salvage)
        reports = [run_validate(p, options=opts) for p in dumps]
        code = max(r.exit_code for r in reports)
        if as_json:
            _print_json(reports[0].to_dict() if len(reports) == 1 else [r.to_dict() for r in reports])
        else:
            out = []
            for r in reports:
                if r.unreadable:
                    # Unreadable input: the one-line error goes to stderr, like every other command's errors.
                    first = next(f for f in r.findings if f.severity == "error")
                    err = FormatError(first.message, path=first.path, offset=first.offset, field=first.field,
                                      group=first.group if first.group else None)
                    sys.stderr.write(f"Error: {err}\n")
                    continue
                out.extend(f.line() for f in r.findings)
                state = "valid" if r.valid else "INVALID"
                out.append(f"{r.path}: {state} ({r.errors} errors, {r.warnings} warnings; {r.groups} groups, "
                           f"{r.size:,} bytes)")
            if out:
                sys.stdout.write("\n".join(out) + "\n")
        raise typer.Exit(code)


def register_demo(app: typer.Typer) -> None:
    @app.command()
    def demo(
        out: Path = typer.Option(Path("kvconv-demo"), "-o", "--out", help="folder for the dump and its outputs"),
    ) -> None:
        """Run the main job on the embedded Qwen3-14B fixture: write the dump (qwen3-14b.kvdump, from the generator
        shipped in the package), then info, validate, reconcile, Perfetto and Chrome traces, Parquet tables. A rerun
        replaces these qwen3-14b.* outputs and nothing else in the folder.

        Example: kvconv demo -o /tmp/demo   (then open /tmp/demo/qwen3-14b.pftrace in ui.perfetto.dev)
        """
        from . import cli
        from .demo import qwen3_14b

        out.mkdir(parents=True, exist_ok=True)
        fixture = out / "qwen3-14b.kvdump"
        qwen3_14b.write(fixture, qwen3_14b.build())
        sys.stdout.write(f"wrote {fixture} ({fixture.stat().st_size:,} bytes: the Qwen3-14B run reconstructed from "
                         "its published figures)\n")
        steps = [["info", str(fixture)], ["validate", str(fixture)], ["reconcile", str(fixture)],
                 ["perfetto", str(fixture), "-o", str(out / "qwen3-14b.pftrace"), "--force"],
                 ["chrome", str(fixture), "-o", str(out / "qwen3-14b.json"), "--force"],
                 ["arrow", str(fixture), "-o", str(out / "qwen3-14b-parquet"), "--format", "parquet"]]
        worst = 0
        for step in steps:
            sys.stdout.write(f"\n$ kvconv {' '.join(step)}\n")
            sys.stdout.flush()
            worst = max(worst, cli.main(step))
        sys.stdout.write(f"\noutputs in {out}/: open qwen3-14b.pftrace in https://ui.perfetto.dev\n")
        raise typer.Exit(worst)
