"""pytest setup for tests/models: makes `kiln_models`, `generate` and `golden` importable and keeps
torch on one thread (the machine is shared with builds)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """Generate each tiny preset once per session (f32, seed 0): {preset name: directory}."""
    import generate
    from kiln_models.presets import TINY_PRESETS
    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for name in TINY_PRESETS:
        generate.generate(name, str(root / name), seed=0, quiet=True)
        out[name] = str(root / name)
    return out
