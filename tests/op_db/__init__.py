"""The table that drives the generic tests: one OpInfo per myns operator, one module per op family.

Adding an op means adding its OpInfo to its family's module (samples, reference, error inputs) and the module
to FAMILIES below; test_ops.py, test_pt2.py and test_registration.py then cover it on every path.
"""

from __future__ import annotations

from op_db import csr, elementwise, loss, norm, rotary
from collections.abc import Callable
from typing import Any

from op_db.core import ErrorInput, OpInfo, Sample, expect, upcast  # noqa: F401
from op_db.csr import _csr_indices, csr_spmm_reference, csr_transpose_reference  # noqa: F401
from op_db.norm import rms_norm_reference  # noqa: F401

FAMILIES = (elementwise, csr, norm, loss, rotary)
OP_DB: list[OpInfo] = [info for family in FAMILIES for info in family.OPS]
OPS_BY_NAME = {info.name: info for info in OP_DB}


def ops(predicate: Callable[[OpInfo], bool] = lambda info: True) -> list[Any]:
    """OpInfos as pytest params, ids = op names."""
    import pytest

    return [pytest.param(info, id=info.name) for info in OP_DB if predicate(info)]
