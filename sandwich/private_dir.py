"""A directory under the temp dir that only this user can write: the process loads code from
what it keeps there (compiled micro-benchmarks, Lark's pickled parser tables), so a
predictable path in a shared /tmp must not be another user's."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def private_dir(name: str) -> Path:
    """`<tmp>/sandwichc-<uid>/<name>`, made 0700 where missing; PermissionError naming the
    directory if it, or the root, is a symlink, another user's, or open to others."""
    root = Path(tempfile.gettempdir()) / f"sandwichc-{os.getuid()}"
    for d in (root, root / name):
        d.mkdir(exist_ok=True, mode=0o700)
        st = d.lstat()
        if d.is_symlink() or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise PermissionError(f"{d} is not a private directory of this user; remove it and retry")
    return root / name
