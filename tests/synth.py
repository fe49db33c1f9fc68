"""Small synthetic dumps for tests: the valid-small parts from fixtures/bad/generate.py, to damage one at a time.

    parts = synth.small_parts(); parts["device_event"]["sequence"][4] = 9; synth.write_parts(path, parts)
"""


from conftest import FIXTURES, load_script

_mod = load_script(FIXTURES / "bad" / "generate.py")

small_parts = _mod.small_parts
write_parts = _mod.write_parts
