"""torch's own files read as data: a file (or a slice of one) in torch.save's zip format is checked
before torch reads a byte of it, so a few MB never become GBs in memory.

torch.save writes a zip of stored (uncompressed) entries. A deflated entry, or one declaring more
bytes than the file holds, is how a small file inflates before torch's own checks run (a 2.9 MB
file of deflated zeros cost 3.3 GB). torch's older, non-zip format is refused too: it allocates
every storage at the size the file declares before reading it.
"""

from __future__ import annotations

import zipfile
from typing import IO


def zip_entries_problem(f: IO[bytes], size: int) -> str | None:
    """Why the torch file `f` (seekable, `size` bytes) must not be read, or None."""
    try:
        with zipfile.ZipFile(f) as z:
            entries = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return "not torch's zip format; relay reads files saved by torch >= 1.6"
    for info in entries:
        stored = info.compress_type == zipfile.ZIP_STORED and info.file_size == info.compress_size
        if not stored or info.header_offset + info.compress_size > size:
            return (
                f"entry {info.filename[:80]!r} declares {info.file_size} bytes from {info.compress_size} "
                f"in a {size}-byte file; torch writes uncompressed entries within the file only"
            )
    return None
