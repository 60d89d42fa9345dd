"""How much of PyTorch's own test databases (OpInfo's ``op_db``, ModuleInfo's ``module_db``) a
run takes: a fixed share under ``make test``, the whole of each under ``make fuzz``.

``make test`` must stay cheap, so the tests that sweep a database take the entries whose name
hashes into a fixed share (:func:`in_share`): the same entries on every run and machine, a
different subset for each share, and a new entry joins one or not by its name alone.
``make fuzz`` sets ``FXVIEWS_WHOLE_DATABASES=1``, and then every entry is taken.

Example::

    >>> [name for name in ("add", "sub", "mul") if in_share(name, 4)]  # about 1 in 4
    ['mul']
"""

from __future__ import annotations

import os
import zlib

__all__ = ["WHOLE_DATABASES", "in_share", "whole_databases"]

#: The environment variable that makes every database test take every entry (``make fuzz``).
WHOLE_DATABASES = "FXVIEWS_WHOLE_DATABASES"


def whole_databases() -> bool:
    """Whether this run takes every entry of each database (``FXVIEWS_WHOLE_DATABASES=1``)."""
    return os.environ.get(WHOLE_DATABASES, "") == "1"


def in_share(name: str, share: int) -> bool:
    """Whether the entry ``name`` is in the fixed 1-in-``share`` sample of its database (every
    entry under :func:`whole_databases`). CRC-32 of the name: the same in every process, where
    ``hash`` of a str is randomized."""
    return whole_databases() or zlib.crc32(name.encode()) % share == 0
