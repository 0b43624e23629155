"""Downloading one gzipped text file into place: verified first, then renamed atomically.

The file is fetched with urllib, decompressed while it streams, hashed (sha256 of the text) and
its lines counted, into a temporary file beside the destination; only a file that passes its
checks is renamed to its final name, so a file that exists is a verified one and an interrupted
download leaves nothing behind that a later run would trust. Every failure is one `DataError`
line naming the URL.
"""
from __future__ import annotations

import gzip
import hashlib
import http.client
import urllib.error
import urllib.request
import zlib
from pathlib import Path

from s2s.core.errors import DataError
from s2s.core.files import replacing

TIMEOUT_S = 60
_CHUNK = 1 << 20


def fetch_gzip(url: str, dest: Path, sha256: str | None = None, lines: int | None = None) -> Path:
    """Download gzipped `url`, decompressed, to `dest`, checking the text's sha256 and/or line count."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest, count = hashlib.sha256(), 0
    with replacing(dest, "wb") as out:  # any error below leaves no file behind
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response, \
                    gzip.GzipFile(fileobj=response) as text:
                while chunk := text.read(_CHUNK):
                    digest.update(chunk)
                    count += chunk.count(b"\n")
                    out.write(chunk)
        except urllib.error.HTTPError as e:
            raise DataError(f"{url}: HTTP error {e.code} ({e.reason})") from None
        except urllib.error.URLError as e:
            raise DataError(f"{url}: cannot connect ({e.reason})") from None
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise DataError(f"{url}: truncated or corrupt gzip data ({e})") from None
        except (OSError, http.client.HTTPException) as e:
            raise DataError(f"{url}: download failed ({type(e).__name__}: {e})") from None
        if sha256 is not None and digest.hexdigest() != sha256:
            raise DataError(f"{url}: checksum mismatch: sha256 of the text is {digest.hexdigest()}, "
                            f"expected {sha256}")
        if lines is not None and count != lines:
            raise DataError(f"{url}: {count} lines, expected {lines}")
    return dest
