"""Parse and format Linux cpu lists ("0-3,8") and hwloc cpuset masks ("0x0000ffff,0xffffffff")."""

from __future__ import annotations

from collections.abc import Iterable

from sandwich.errors import TopologyError


def parse_cpulist(text: str, *, source: str) -> frozenset[int]:
    """`0-3,8,10-11` -> {0,1,2,3,8,10,11}; an empty list is returned empty, callers decide."""
    cpus: set[int] = set()
    text = text.strip()
    if not text:
        return frozenset()
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise TopologyError(f"{source}: bad cpu list {text!r}; expected ranges like '0-3,8'") from None
        if a < 0 or b < a:
            raise TopologyError(f"{source}: bad cpu range {part!r} in {text!r}; expected low-high with low <= high")
        cpus.update(range(a, b + 1))
    return frozenset(cpus)


def parse_cpumask(text: str, *, source: str) -> frozenset[int]:
    """A Linux sysfs mask (`thread_siblings`, `shared_cpu_map`): comma-separated 32-bit hex
    words, most significant first, without `0x` ("00000000,0000ff00")."""
    words = [w.strip() for w in text.strip().split(",")]
    if not words or not all(w and len(w) <= 8 and all(c in "0123456789abcdefABCDEF" for c in w)
                            for w in words):
        raise TopologyError(f"{source}: bad cpu mask {text!r}; expected hex words like "
                            f"'00000000,0000ffff'")
    return parse_hwloc_cpuset(text, source=source)


def format_cpulist(cpus: Iterable[int]) -> str:
    """{0,1,2,3,8} -> '0-3,8' (the inverse of parse_cpulist)."""
    ids = sorted(set(cpus))
    out: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


def parse_hwloc_cpuset(text: str, *, source: str) -> frozenset[int]:
    """hwloc mask: comma-separated 32-bit hex words, most significant first ('0xf...f' = infinite)."""
    words = [w.strip() for w in text.strip().split(",") if w.strip()]
    if not words:
        return frozenset()
    cpus: set[int] = set()
    for pos, word in enumerate(reversed(words)):
        body = word[2:] if word.lower().startswith("0x") else word
        if body.endswith("..."):
            raise TopologyError(f"{source}: infinite cpuset {text!r} is not supported; export with lstopo --of xml")
        try:
            value = int(body, 16)
        except ValueError:
            raise TopologyError(f"{source}: bad cpuset {text!r}; expected hex words like '0x000000ff'") from None
        bit = 0
        while value:
            if value & 1:
                cpus.add(pos * 32 + bit)
            value >>= 1
            bit += 1
    return frozenset(cpus)


def format_hwloc_cpuset(cpus: Iterable[int]) -> str:
    """Inverse of parse_hwloc_cpuset, as lstopo writes it."""
    mask = 0
    for c in cpus:
        mask |= 1 << c
    words = []
    while True:
        words.append(f"0x{mask & 0xFFFFFFFF:08x}")
        mask >>= 32
        if not mask:
            break
    return ",".join(reversed(words))
