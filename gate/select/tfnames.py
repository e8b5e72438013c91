"""TensorFlow's own rule for naming the Python function generated for a registered op
(``GenerateLowerCaseOpName`` in TF's python op generator): an underscore goes before a capital
that follows a lower-case letter or precedes one, unless an underscore is already there;
everything is lower-cased. ``Conv2D`` -> ``conv2d``, ``MatMul`` -> ``mat_mul``,
``TopKV2`` -> ``top_kv2``, ``RGBToHSV`` -> ``rgb_to_hsv``, ``_FusedConv2D`` -> ``_fused_conv2d``."""
from __future__ import annotations


def tf_snake(name: str) -> str:
    out = []
    last = len(name) - 1
    for i, c in enumerate(name):
        if c.isupper() and i > 0:
            if name[i - 1].islower() or (i < last and name[i + 1].islower()):
                if name[i - 1] != "_":
                    out.append("_")
        out.append(c.lower())
    return "".join(out)
