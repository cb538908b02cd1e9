"""Fake (meta) kernels for every torch.ops.myns operator, so torch.compile and torch.export can trace them.

This folder is the package ``torchops._meta_kernels``: a wheel installs it there, and ``import torchops``
loads it under that name from a source tree (torchops/_native.py). The C++ library names its modules
(``set_python_module``) as the home of its fake kernels; the registrations must therefore live inside it,
and the modules import each other relatively. One module per op group (``meta_kernels/<op>.py``), each
imported here by discovery: a new module needs no edit of this file. Modules starting with an underscore
are helpers (``_checks``), imported by the others.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")
