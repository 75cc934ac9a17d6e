"""List the numbers of one REPORT.md that another no longer contains (``python scripts/diff_report_numbers.py
OLD NEW``): every number that vanished or changed between two generated reports, with the line it stood in,
so a regeneration can be checked number by number. Commit hashes and dates are ignored."""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

IGNORE = re.compile(r"commit [0-9a-f]+(\+dirty)?|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ|\b[0-9a-f]{7,40}\b|figures/\S+")
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[-+]?\d+)?%?")


def numbers(text: str) -> Counter[str]:
    return Counter(n for line in text.splitlines() for n in NUMBER.findall(IGNORE.sub(" ", line)))


def main(old: str, new: str) -> int:
    a, b = Path(old).read_text(), Path(new).read_text()
    gone = numbers(a) - numbers(b)
    for n, count in sorted(gone.items()):
        where = next(line.strip()[:160] for line in a.splitlines() if n in NUMBER.findall(IGNORE.sub(" ", line)))
        print(f"{n} (x{count}): {where}")
    print(f"{sum(gone.values())} numbers of {old} are not in {new}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
