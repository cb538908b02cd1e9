import os
import sys

import pytest
import torch

# Tests import their helpers (helpers.py, op_db.py) as top-level modules.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torchops  # noqa: E402,F401  registers torch.ops.myns

# Under pytest-xdist each worker process would run torch's CPU kernels on every core of the machine and
# Inductor would start a compile pool as large: 16 workers on 16 cores meant hundreds of threads contending.
# Each worker takes its share of the cores instead (at least two threads, so the CPU kernels' parallel
# paths still run) and compiles in its own process.
_XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if _XDIST_WORKERS > 1:
    torch.set_num_threads(max(2, (os.cpu_count() or 2) // _XDIST_WORKERS))
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


# A device call can be cut by its time limit before pytest prints its summary: with TORCHOPS_FAILURE_LOG set,
# each failure is appended to that file as it happens (by the controller only, not again by xdist workers).
_FAILURE_LOG = os.environ.get("TORCHOPS_FAILURE_LOG")


def pytest_runtest_logreport(report) -> None:
    if _FAILURE_LOG and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:
        with open(_FAILURE_LOG, "a") as log:
            log.write(f"FAILED {report.nodeid} ({report.when})\n{report.longreprtext[-3000:]}\n\n")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_collection_modifyitems(items) -> None:
    # The tests sharing one pytest-xdist worker (helpers.needs_gpu_memory: one after another) first, so that
    # under --dist loadgroup their serial run starts with the suite instead of trailing it.
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)
