"""hwloc-style sysfs snapshot archives (`NAME.tar.bz2` beside `NAME.console`): list and unpack them."""

from __future__ import annotations

import tarfile
from pathlib import Path

from sandwich.errors import TopologyError

SUFFIX = ".tar.bz2"


def snapshot_names(data: Path) -> list[str]:
    """The snapshot names in `data` (archive file names less `.tar.bz2`), sorted."""
    return sorted(p.name[: -len(SUFFIX)] for p in Path(data).glob(f"*{SUFFIX}"))


def extract_snapshot(archive: Path, into: Path) -> Path:
    """Unpack `archive` under `into` and return the snapshot root (laid out like `/`).

    The archive holds one top directory, not always named as the file. Members that would
    land outside `into` (absolute paths, `..`, device files) are refused by tarfile's
    "tar" filter rather than written.
    """
    try:
        with tarfile.open(archive) as tf:
            tf.extractall(into, filter="tar")
    except (OSError, tarfile.TarError) as e:
        raise TopologyError(f"{archive}: cannot unpack the snapshot ({e})") from None
    dirs = [p for p in Path(into).iterdir() if p.is_dir()]
    if len(dirs) != 1:
        raise TopologyError(f"{archive}: expected one top directory in the archive, found "
                            f"{len(dirs)} ({', '.join(sorted(p.name for p in dirs)) or 'none'})")
    return dirs[0]
