"""Finding a reader's files: local paths, filesystem URIs, directories, globs.

Every reader takes a `path_or_glob` and an optional `pyarrow.fs.FileSystem`.
Without a filesystem, a path holding "://" is a URI that pyarrow resolves to
its filesystem (`file:///data/logs`, or any scheme pyarrow was built with);
any other path is local. Globs are matched by this module, one path segment
at a time (`*`, `?` and `[...]` within a segment, `**` for any number of
segments), because pyarrow's filesystems list directories but do not glob.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
from collections.abc import Sequence

import pyarrow.fs as pafs

_WILDCARDS = frozenset("*?[")

# Files the way pyarrow.dataset skips them in a directory: hidden files and
# the `_SUCCESS`, `_metadata`, ... markers that Spark and Hive write.
_SKIPPED_PREFIXES = (".", "_")


@dataclasses.dataclass(frozen=True)
class Located:
    """The files a path or glob names, and where partition paths start.

    Args:
        filesystem: the filesystem the paths are in.
        paths: the files, sorted.
        base_dir: the directory below which `key=value` path segments are
            partition values: the directory given, the fixed part of a glob,
            or a single file's own directory.

    Example:

    ```python
    from reckeras.datasets._files import locate

    located = locate("/data/logs", None, (".parquet",), "parquet")
    located.paths   # ['/data/logs/dt=2026-11-30/part-0.parquet', ...]
    ```
    """

    filesystem: pafs.FileSystem
    paths: list[str]
    base_dir: str


def file_error(path: str, error: Exception) -> Exception:
    """The error to raise for a file pyarrow could not read, naming the file.

    Args:
        path: the file.
        error: pyarrow's error: an `OSError` (I/O, truncated compressed
            stream, bad ORC footer) or an `ArrowInvalid` (bad data; its
            message often names the column and row).

    Returns:
        An error of the same kind (`ValueError` for bad data, the same
        `OSError` subclass for I/O) whose message starts with the path,
        unless pyarrow's message already holds it.

    Example:

    ```python
    from reckeras.datasets._files import file_error

    try:
        fragment.count_rows()
    except (pa.ArrowInvalid, OSError) as error:
        raise file_error(fragment.path, error) from error
    ```
    """
    message = str(error) if path in str(error) else f"{path}: {error}"
    return type(error)(message) if isinstance(error, OSError) else \
        ValueError(message)


def _has_wildcard(text: str) -> bool:
    return any(char in _WILDCARDS for char in text)


def _segment_matches(pattern: str, name: str) -> bool:
    # As in glob.glob, a wildcard does not match a leading dot.
    if name.startswith(".") and not pattern.startswith("."):
        return False
    return fnmatch.fnmatchcase(name, pattern)


def _matches(pattern: Sequence[str], parts: Sequence[str]) -> bool:
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_matches(pattern[1:], parts[skip:])
                   for skip in range(len(parts) + 1))
    return (bool(parts) and _segment_matches(pattern[0], parts[0])
            and _matches(pattern[1:], parts[1:]))


def _listed_files(filesystem: pafs.FileSystem, directory: str) -> list[str]:
    selector = pafs.FileSelector(directory, recursive=True)
    return [info.path for info in filesystem.get_file_info(selector)
            if info.type == pafs.FileType.File]


def _relative_parts(path: str, directory: str) -> list[str]:
    return path[len(directory):].strip("/").split("/")


def _glob(filesystem: pafs.FileSystem, pattern: str) -> tuple[list[str], str]:
    segments = pattern.split("/")
    fixed = 0
    while not _has_wildcard(segments[fixed]):
        fixed += 1
    base = "/".join(segments[:fixed])
    if fixed == 1 and segments[0] == "":
        base = "/"
    local_relative = not base and isinstance(filesystem, pafs.LocalFileSystem)
    listed_from = "." if local_relative else base
    if filesystem.get_file_info(listed_from).type != pafs.FileType.Directory:
        return [], base
    files = [path for path in _listed_files(filesystem, listed_from)
             if _matches(segments[fixed:], _relative_parts(path, listed_from))]
    if local_relative:
        files = [path.removeprefix("./") for path in files]
    return files, base


def _from_uri(uri: str) -> tuple[pafs.FileSystem, str]:
    wildcard = next((i for i, char in enumerate(uri) if char in _WILDCARDS),
                    None)
    if wildcard is None:
        return pafs.FileSystem.from_uri(uri)
    # `[` is not valid in a URI: resolve the directory above the first
    # wildcard, then append the pattern's remainder to its path.
    cut = uri.rfind("/", 0, wildcard)
    prefix = uri[:cut]
    filesystem, directory = pafs.FileSystem.from_uri(
        prefix + "/" if prefix.endswith(":/") else prefix)
    return filesystem, directory.rstrip("/") + uri[cut:]


def locate(path_or_glob: str | os.PathLike, filesystem: pafs.FileSystem | None,
           suffixes: Sequence[str], what: str) -> Located:
    """The files a reader opens.

    Args:
        path_or_glob: a file, a directory (every file below it whose name
            ends with one of `suffixes`, but for hidden and `_`-prefixed
            ones), or a glob; a local path or, when `filesystem` is None, a
            URI such as "file:///data/logs".
        filesystem: the filesystem `path_or_glob` is in, or None (local, or
            read from the URI).
        suffixes: the file name endings a directory's files are kept by,
            e.g. `(".parquet",)`.
        what: the format's name, for the error message.

    Returns:
        The `Located` files, in sorted path order.

    Raises:
        FileNotFoundError: when nothing matches (naming `path_or_glob`).

    Example:

    ```python
    from reckeras.datasets._files import locate

    located = locate("file:///data/day_*.csv", None, (".csv",), "CSV")
    ```
    """
    pattern = os.fspath(path_or_glob)
    if filesystem is not None:
        path = pattern
    elif "://" in pattern:
        filesystem, path = _from_uri(pattern)
    else:
        filesystem, path = pafs.LocalFileSystem(), pattern
    if _has_wildcard(path):
        files, base = _glob(filesystem, path)
    else:
        kind = filesystem.get_file_info(path).type
        if kind == pafs.FileType.Directory:
            base = path.rstrip("/") or "/"
            files = [
                file for file in _listed_files(filesystem, base)
                if file.endswith(tuple(suffixes)) and not any(
                    part.startswith(_SKIPPED_PREFIXES)
                    for part in _relative_parts(file, base))]
        else:
            base = path.rpartition("/")[0]
            files = [path] if kind == pafs.FileType.File else []
    if not files:
        raise FileNotFoundError(f"no {what} files match {pattern!r}")
    return Located(filesystem, sorted(files), base)
