"""hwloc-style sysfs snapshot archives (`NAME.tar.bz2` beside `NAME.console`): list and unpack them."""

from __future__ import annotations

import posixpath
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
    land outside `into` (absolute paths, `..`, links pointing out, device files) are refused
    rather than written (`_inside`: checked on the names, as tarfile's "tar" filter does with
    two realpath calls a member, which made a 16,000-file snapshot take 9 s).
    """
    try:
        with tarfile.open(archive) as tf:
            tf.extractall(into, filter=_inside)
    except (OSError, tarfile.TarError) as e:
        raise TopologyError(f"{archive}: cannot unpack the snapshot ({e})") from None
    dirs = [p for p in Path(into).iterdir() if p.is_dir()]
    if len(dirs) != 1:
        raise TopologyError(f"{archive}: expected one top directory in the archive, found "
                            f"{len(dirs)} ({', '.join(sorted(p.name for p in dirs)) or 'none'})")
    return dirs[0]


def _inside(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """`member` if it is a file, directory or link that stays under the archive's root, with
    no owner to set (files are written as the user who unpacks); tarfile.FilterError if not."""
    name = posixpath.normpath(member.name)
    if posixpath.isabs(name) or name.split("/")[0] == "..":
        raise tarfile.OutsideDestinationError(member, name)
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise tarfile.SpecialFileError(member)
    if member.issym() or member.islnk():
        base = posixpath.dirname(name) if member.issym() else ""
        target = posixpath.normpath(posixpath.join(base, member.linkname))
        if posixpath.isabs(member.linkname) or target.split("/")[0] == "..":
            raise tarfile.LinkOutsideDestinationError(member, target)
    return member.replace(uid=None, gid=None, uname=None, gname=None, mode=member.mode & 0o755,
                          deep=False)
