"""Writing results atomically and keeping the list of what was made and what was skipped.

Every file goes to a temporary name in the output folder and is renamed into place, so a reader
(or a concurrent re-run) never sees half a figure or table. The index (README.md) lists each
output with a one-line description, the runs that were incomplete and the outputs that could not
be made, with the reason.
"""
from __future__ import annotations

import csv
import io
import os
import tempfile
from dataclasses import dataclass, field

from gravac.core.io import atomic_write


def csv_text(rows: list[dict], columns: list[str]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in columns})
    return buf.getvalue()


class OutputError(Exception):
    """The output folder cannot be used; the message says why in one line."""


def make_folder(path: str) -> None:
    """Make output folder `path` (and its parents) and prove it takes files; OutputError (one
    line) when it is a file or cannot take files (read-only, no permission, a file on the way)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputError(f"output folder {path} is a file, not a folder")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise OutputError(f"cannot write into output folder {path} ({e.strerror})") from None


@dataclass
class Outputs:
    """The output folder and its inventory."""
    folder: str
    formats: tuple = ("png", "pdf")
    made: list[tuple[str, str]] = field(default_factory=list)      # (file names, description)
    skipped: list[tuple[str, str]] = field(default_factory=list)   # (output, reason)

    def __post_init__(self):
        make_folder(self.folder)

    def figure(self, fig, stem: str, description: str) -> None:
        """Save `fig` as STEM.png and STEM.pdf (the chosen formats) and close it. No tight bounding
        box: the figures' constrained layout already fits them, and a tight box draws each twice."""
        import matplotlib.pyplot as plt
        names = []
        for ext in self.formats:
            buf = io.BytesIO()
            fig.savefig(buf, format=ext, dpi=200)   # laid out by its constrained layout: one draw, not two
            atomic_write(os.path.join(self.folder, f"{stem}.{ext}"), buf.getvalue())
            names.append(f"{stem}.{ext}")
        plt.close(fig)
        self.made.append((" ".join(names), description))

    def table(self, stem: str, markdown: str, rows: list[dict], columns: list[str], description: str) -> None:
        """Write STEM.md (for reading) and STEM.csv (every number, unformatted)."""
        atomic_write(os.path.join(self.folder, f"{stem}.md"), markdown)
        atomic_write(os.path.join(self.folder, f"{stem}.csv"), csv_text(rows, columns))
        self.made.append((f"{stem}.md {stem}.csv", description))

    def skip(self, what: str, reason: str) -> None:
        self.skipped.append((what, reason))

    def write_index(self, header: str, incomplete: list[tuple[str, list[str]]], conventions: str,
                    left_out: list[tuple[str, str]] = ()) -> None:
        """README.md: what was made, what not and why, the runs left out and the incomplete ones."""
        lines = ["# Figures and tables", "", header, "", "## Made", ""]
        lines += [f"- `{files}`: {desc}" for files, desc in self.made] or ["(nothing)"]
        if self.skipped:
            lines += ["", "## Not made", ""] + [f"- {what}: {why}" for what, why in self.skipped]
        if left_out:
            lines += ["", "## Runs left out", ""] + [f"- `{path}`: {why}" for path, why in left_out]
        if incomplete:
            lines += ["", "## Incomplete runs (used for what they contain)", ""]
            lines += [f"- `{path}`: {'; '.join(why)}" for path, why in incomplete]
        lines += ["", "## Conventions", "", conventions.strip(), ""]
        atomic_write(os.path.join(self.folder, "README.md"), "\n".join(lines))
