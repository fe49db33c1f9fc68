"""Engine plugins: kvconv's probes attached to an unmodified inference engine from inside its own processes.

``kvconv.capture.engines.vllm`` is vLLM's ``vllm.general_plugins`` entry point and ``kvconv.capture.engines.sglang``
SGLang's ``sglang.srt.plugins`` one (pyproject.toml): with ``KVCONV_ENGINE=vllm`` / ``sglang`` in the environment
(``kvconv record --writes --engine vllm|sglang``) they register the KV caches and record every step's slot mapping
and the releases; vLLM's with ``KVCONV_VALUE=1`` the value digests, SGLang's with ``KVCONV_CANARY=1`` the location
canary (docs/guides/vllm.md, docs/guides/sglang.md; docs/CANARY.md, "Engine recipes"). Without it, nothing is
imported and nothing is patched.

    $ KVCONV_ENGINE=vllm python -c "from kvconv.capture.engines import vllm; vllm.register()"
"""
