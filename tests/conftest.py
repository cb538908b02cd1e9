import os
import sys

import pytest
import torch

# Tests import their helpers (helpers.py, op_db.py) as top-level modules.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torchops  # noqa: E402,F401  registers torch.ops.myns


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
