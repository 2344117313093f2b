"""Writing a file that other processes may read at the same moment."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole: into a temporary file beside it, flushed to disk, then renamed
    into place, so a concurrent reader (or a crash) sees the old file or the new one, never a part.
    Creates the directory; an OSError (read-only directory, full disk) leaves ``path`` as it was and
    no temporary file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
