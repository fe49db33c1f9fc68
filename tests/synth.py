"""Small synthetic dumps for tests: the valid-small parts from fixtures/bad/generate.py, to damage one at a time.

    parts = synth.small_parts(); parts["device_event"]["sequence"][4] = 9; synth.write_parts(path, parts)
"""

import importlib.util

from conftest import FIXTURES

_spec = importlib.util.spec_from_file_location("kvconv_bad_fixtures", FIXTURES / "bad" / "generate.py")
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)

small_parts = _mod.small_parts
write_parts = _mod.write_parts
