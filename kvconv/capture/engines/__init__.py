"""Engine plugins: kvconv's probes attached to an unmodified inference engine from inside its own processes.

``kvconv.capture.engines.vllm`` is vLLM's ``vllm.general_plugins`` entry point (pyproject.toml): with
``KVCONV_ENGINE=vllm`` in the environment (``kvconv record --writes --engine vllm``) it registers the KV caches and
records every step's slot mapping, the releases and, with ``KVCONV_VALUE=1``, the value digests (docs/CANARY.md,
"Engine recipes"). Without it, nothing is imported and nothing is patched.

    $ KVCONV_ENGINE=vllm python -c "from kvconv.capture.engines import vllm; vllm.register()"
"""
