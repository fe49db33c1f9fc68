"""kvconv: see which CUDA-graph node, replay and block wrote the KV cache.

    >>> import kvconv
    >>> kvconv.__version__
    '0.1.0'

Modules: ``dump`` (open/new), ``validate``, ``reconcile``, ``canary``, ``emit`` (perfetto, chrome, arrow), ``record``.
"""

__version__ = "0.1.0"
