"""kvconv record at the edges of its command line (issue 28), without a GPU: the stand-in library of test_record (the
child commands here use no CUDA, so CUDA_INJECTION64_PATH is never loaded) and child commands that write, damage or
die. Options before ``--`` are options; ``KVCONV_EVENTS`` of the environment is taken or a conflict refused; the exit
status is the command's (128+N for a signal, as shells give), else the dumps' verdict (docs/TRACER.md)."""

from __future__ import annotations

import shlex
import sys

from test_record import WRITER, fake_lib  # noqa: F401 - fake_lib is a fixture used by the tests below

from conftest import run_cli


def _writer(tmp_path) -> str:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def test_mistyped_option_is_a_usage_error_not_the_command(tmp_path, fake_lib):  # noqa: F811
    ran = tmp_path / "ran"
    r = run_cli("record", "--kernal", "foo", "-o", tmp_path / "x.kvdump", "--", "sh", "-c", f"touch {ran}")
    assert r.returncode == 2, r
    assert "No such option: --kernal" in r.stderr and "command not found" not in r.stderr, r.stderr
    assert not ran.exists()
    # the command's own options, after --, are its own (and after its first word without --)
    for cmd in (["--", "sh", "-c", f"touch {ran}", "-x"], ["sh", "-c", f"touch {ran}", "--kernal"]):
        r = run_cli("record", "-o", tmp_path / "x.kvdump", *cmd)
        assert ran.exists() and "wrote no dump" in r.stderr, r
        ran.unlink()


def test_events_from_the_environment(tmp_path, fake_lib):  # noqa: F811
    seen = tmp_path / "events"
    child = ["--", "sh", "-c", f'printf %s "$KVCONV_EVENTS" > {seen}']
    out = tmp_path / "x.kvdump"
    r = run_cli("record", "-o", out, *child, env={"KVCONV_EVENTS": "enter,exit"})
    assert seen.read_text() == "enter,exit", r  # was: enter (the environment's value silently overridden)
    seen.unlink()
    r = run_cli("record", "--events", "exit,enter", "-o", out, *child, env={"KVCONV_EVENTS": "enter,exit"})
    assert seen.read_text() == "exit,enter", r  # the same set: no conflict
    seen.unlink()
    r = run_cli("record", "--events", "enter", "-o", out, *child, env={"KVCONV_EVENTS": "enter,exit"})
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r
    assert "--events enter contradicts KVCONV_EVENTS=enter,exit" in r.stderr and not seen.exists()
    r = run_cli("record", "-o", out, *child, env={"KVCONV_EVENTS": ""})
    assert seen.read_text() == "enter", r  # unset or empty: the default
    seen.unlink()
    r = run_cli("record", "-o", out, *child, env={"KVCONV_EVENTS": "enter,bogus"})
    assert r.returncode == 2 and "KVCONV_EVENTS=enter,bogus in the environment is not a subset" in r.stderr, r
    assert r.stderr.count("\n") == 1 and not seen.exists()


def test_a_signal_gives_128_plus_n_and_the_dump_verdict_apart(tmp_path, fake_lib):  # noqa: F811
    r = run_cli("record", "-o", tmp_path / "none.kvdump", "--", "sh", "-c", "kill -ABRT $$")
    assert r.returncode == 134, r  # was 250 (256 - 6)
    out = tmp_path / "d.kvdump"
    r = run_cli("record", "-k", "my_kernel", "-o", out, "--", "sh", "-c", f"{_writer(tmp_path)} && kill -KILL $$")
    assert r.returncode == 137, r
    assert f"{out}: valid" in r.stdout, r.stdout  # the dump is judged apart from the status


def test_exit_0_with_a_damaged_dump_exits_1(tmp_path, fake_lib):  # noqa: F811
    """The documented rule (docs/TRACER.md): a command that exited 0 takes the worst dump's verdict; one that failed
    keeps its own status, and the dump's verdict is printed apart."""
    out = tmp_path / "d.kvdump"
    damage = (f"{shlex.quote(sys.executable)} -c \"f = open({str(out)!r}, 'r+b'); f.seek(-8, 2); b = f.read(1); "
              "f.seek(-8, 2); f.write(bytes([b[0] ^ 255]))\"")
    r = run_cli("record", "-k", "my_kernel", "-o", out, "--", "sh", "-c", f"{_writer(tmp_path)} && {damage}")
    assert r.returncode == 1, r
    assert "payload-checksum" in r.stdout and f"{out}: INVALID" in r.stdout, r.stdout
    r = run_cli("record", "-k", "my_kernel", "--force", "-o", out, "--", "sh", "-c",
                f"{_writer(tmp_path)} && {damage} && exit 3")
    assert r.returncode == 3 and f"{out}: INVALID" in r.stdout, r
