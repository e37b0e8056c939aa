"""Operator rules, one module per operator family.

Importing this package imports every module in it, and each module registers its rules
with ``inference.registry.register``; adding a family is adding a module.
"""

import importlib
import pkgutil

for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")
