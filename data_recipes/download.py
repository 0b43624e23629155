"""Downloading one gzipped text file into place: verified first, then renamed atomically.

The file is fetched with urllib, decompressed while it streams, hashed (sha256 of the text) and
its lines counted, into a temporary file beside the destination; only a file that passes its
checks is renamed to its final name, so a file that exists is a verified one and an interrupted
download leaves nothing behind that a later run would trust. Every failure is one `DataError`
line naming the URL.

Two clocks bound a download: `TIMEOUT_S` for each wait on the socket, and an overall deadline
for the whole file (`deadline_s`, else $S2S_DOWNLOAD_DEADLINE seconds, else `DEADLINE_S`),
checked at every read, so that a mirror trickling a byte now and then cannot hold a run forever.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import io
import math
import os
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

from s2s.core.errors import ConfigError, DataError
from s2s.core.files import replacing

TIMEOUT_S = 60  # the longest wait for the server at a time
DEADLINE_S = 3600  # the longest a whole file may take, unless S2S_DOWNLOAD_DEADLINE says otherwise
DEADLINE_ENV = "S2S_DOWNLOAD_DEADLINE"
_CHUNK = 1 << 20


def deadline_seconds(deadline_s: float | None = None) -> float:
    """The overall deadline of one download: `deadline_s`, else $S2S_DOWNLOAD_DEADLINE, else DEADLINE_S."""
    if deadline_s is not None:
        return float(deadline_s)
    text = os.environ.get(DEADLINE_ENV, "").strip()
    if not text:
        return float(DEADLINE_S)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{DEADLINE_ENV}={text!r}: must be a number of seconds > 0")
    return value


class _Deadlined(io.RawIOBase):
    """The body of an HTTP response, read as it arrives (never waiting to fill a buffer), that
    fails once `seconds` have passed since the download began."""

    def __init__(self, response, url: str, seconds: float, until: float):
        self.response, self.url, self.seconds, self.until = response, url, seconds, until
        self.read1 = getattr(response, "read1", None) or response.read
        # each wait on the socket ends at the deadline at the latest (where the socket is reachable)
        self.sock = getattr(getattr(getattr(response, "fp", None), "raw", None), "_sock", None)

    def readable(self) -> bool:
        return True

    def _late(self) -> DataError:
        return DataError(
            f"{self.url}: not downloaded within {self.seconds:g} s (the server sends too "
            f"slowly; {DEADLINE_ENV} sets the deadline in seconds)"
        )

    def readinto(self, buffer) -> int:
        """Fill `buffer` (gzip reads its header in exact sizes) from what arrives, piece by piece,
        checking the deadline before each piece; short only at the end of the body."""
        view, filled = memoryview(buffer).cast("B"), 0
        while filled < len(view):
            left = self.until - time.monotonic()
            if left <= 0:
                raise self._late()
            if self.sock is not None:
                self.sock.settimeout(min(TIMEOUT_S, left))
            try:
                data = self.read1(len(view) - filled)
            except OSError:  # TimeoutError included
                if time.monotonic() >= self.until:
                    raise self._late() from None
                raise
            if not data:
                break
            view[filled : filled + len(data)] = data
            filled += len(data)
        return filled


def fetch_gzip(
    url: str,
    dest: Path,
    sha256: str | None = None,
    lines: int | None = None,
    deadline_s: float | None = None,
) -> Path:
    """Download gzipped `url`, decompressed, to `dest`, checking the text's sha256 and/or line
    count; the whole download must end within `deadline_seconds(deadline_s)`."""
    dest = Path(dest)
    seconds = deadline_seconds(deadline_s)
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest, count = hashlib.sha256(), 0
    until = time.monotonic() + seconds
    with replacing(dest, "wb") as out:  # any error below leaves no file behind
        try:
            with (
                urllib.request.urlopen(url, timeout=min(TIMEOUT_S, seconds)) as response,
                gzip.GzipFile(fileobj=_Deadlined(response, url, seconds, until)) as text,
            ):
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
            raise DataError(
                f"{url}: checksum mismatch: sha256 of the text is {digest.hexdigest()}, "
                f"expected {sha256}"
            )
        if lines is not None and count != lines:
            raise DataError(f"{url}: {count} lines, expected {lines}")
    return dest
