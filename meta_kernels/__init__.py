"""Fake (meta) kernels for every torch.ops.myns operator, so torch.compile and torch.export can trace them.

The C++ library names this package (``set_python_module``) as the home of its fake kernels; the
registrations must therefore live inside it. One module per op.
"""

from meta_kernels import csr_spmm, gelu_and_mul, rms_norm, swiglu, vector_add  # noqa: F401
