"""Lets SGLang 0.5.12 import under the H200 image's transformers 5.17: ``AutoConfig.register`` gets ``exist_ok=True``.

SGLang registers configs (``qwen3_asr``, ...) that transformers 5.17 now ships itself, and transformers refuses a
second registration ("'qwen3_asr' is already used by a Transformers config"). SGLang pins transformers 5.6.0; this
keeps the image's one instead. Python imports ``sitecustomize`` from PYTHONPATH in every process, so SGLang's
scheduler child gets the patch too. The patch waits for transformers' auto-config module to be imported, so a
process that never imports transformers (kvconv itself) pays nothing.

    export PYTHONPATH=/tmp/sglang/site          # unpack.sh's DEST/site holds this file and SGLang
    python3 -c "import sglang.srt.configs"      # no "already used by a Transformers config"
"""

import importlib.abc
import sys

_TARGET = "transformers.models.auto.configuration_auto"


def _patch(module):
    """Wraps AutoConfig.register once; a config SGLang registers again keeps transformers' own class."""
    cls = module.AutoConfig
    if getattr(cls.register, "_sglang_exist_ok", False):
        return
    original = cls.register

    def register(model_type, config, exist_ok=False):
        return original(model_type, config, exist_ok=True)

    register._sglang_exist_ok = True
    cls.register = staticmethod(register)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the finders after it, then wraps the target's loader to patch after it runs."""

    def find_spec(self, name, path=None, target=None):
        if name != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                _wrap(spec.loader)
                return spec
        return None


def _wrap(loader):
    run = loader.exec_module

    def exec_module(module):
        run(module)
        _patch(module)

    loader.exec_module = exec_module


if _TARGET in sys.modules:  # imported before us (unusual): patch it now
    _patch(sys.modules[_TARGET])
else:
    sys.meta_path.insert(0, _Finder())
