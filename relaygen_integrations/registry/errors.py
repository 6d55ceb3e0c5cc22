"""The registry's exceptions: every failure carries a message that says what to do next."""

from __future__ import annotations

__all__ = ["ChecksumError", "DownloadError", "RegistryError"]


class RegistryError(RuntimeError):
    """A pair could not be fetched, found or resolved; the message says what to do."""


class DownloadError(RegistryError):
    """The chunk packages could not be downloaded or did not contain what the spec says."""


class ChecksumError(RegistryError):
    """An assembled GGUF does not have the published size or sha256 (it has been deleted)."""
