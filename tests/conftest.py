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


def pytest_collection_modifyitems(items) -> None:
    # The tests sharing one pytest-xdist worker (helpers.needs_gpu_memory: one after another) first, so that
    # under --dist loadgroup their serial run starts with the suite instead of trailing it.
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)
