"""Stand-ins for SGLang's objects that kvconv's SGLang plugin reads (SGLang is not installed where the tests run)."""


class ForwardMode:
    """SGLang's ``ForwardMode`` as the plugin asks it: ``decode`` (a CUDA-graph replay) or ``extend``."""

    def __init__(self, name):
        self.name = name

    def is_decode(self):
        return self.name == "decode"

    def is_extend(self):
        return self.name == "extend"

    def is_cuda_graph(self):
        return self.name == "decode"
