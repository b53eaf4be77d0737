"""Finding a reader's files: local paths, filesystem URIs, directories, globs.

Every reader takes a `path_or_glob` and an optional `pyarrow.fs.FileSystem`.
Without a filesystem, a path holding "://" is a URI that pyarrow resolves to
its filesystem (`file:///data/logs`, or any scheme pyarrow was built with);
any other path is local. Globs are matched by this module, one path segment
at a time (`*`, `?` and `[...]` within a segment, `**` for any number of
segments), because pyarrow's filesystems list directories but do not glob.

It also holds what every reader does with a bad file (`on_bad_file`): the
error that names the file (`file_error`) and the policy that raises it or
skips the file and records it (`BadFiles`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import os
import posixpath
from collections.abc import Sequence

import pyarrow as pa
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
        sizes: each file's size in bytes, in the order of `paths`, as the
            listing found them (None where unknown).

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
    sizes: list[int | None] | None = None


# What pyarrow raises for a file it cannot read or decode: `OSError` for
# I/O, truncated compressed streams, bad ORC footers and bad parquet pages;
# `ArrowInvalid` (a `ValueError`) for bad data; a bare `ArrowException` for
# some decompression failures ("Unknown error").
READ_ERRORS = (pa.ArrowException, OSError)

ON_BAD_FILE = ("raise", "skip")

# Lines of a compressed file are counted in reads this small when it breaks,
# so that the line reported is at most this many bytes before the break.
_LINE_PROBE_BYTES = 8 << 10

_LOG = logging.getLogger("reckeras.datasets")


def file_error(path: str, error: Exception, where: str | None = None) -> Exception:
    """The error to raise for a file pyarrow could not read, naming the file.

    Args:
        path: the file.
        error: pyarrow's error: an `OSError` (I/O, truncated compressed
            stream, bad ORC footer, bad parquet page) or another
            `pyarrow.ArrowException` such as `ArrowInvalid` (bad data; its
            message often names the column and row).
        where: the place in the file, e.g. "row group 3", "stripe 1" or
            "after line 120", or None.

    Returns:
        An error of the same kind (the same `OSError` subclass for I/O,
        `ValueError` for anything else) whose message starts with the path
        and `where`; without `where`, a message of pyarrow's that already
        holds the path is kept as it is.

    Example:

    ```python
    from reckeras.datasets._files import READ_ERRORS, file_error

    try:
        fragment.count_rows()
    except READ_ERRORS as error:
        raise file_error(fragment.path, error) from error
    ```
    """
    if where is not None:
        message = f"{path}, {where}: {error}"
    else:
        message = str(error) if path in str(error) else f"{path}: {error}"
    return type(error)(message) if isinstance(error, OSError) else \
        ValueError(message)


def check_on_bad_file(on_bad_file: object) -> str:
    """Checks a reader's `on_bad_file` argument.

    Args:
        on_bad_file: the argument.

    Returns:
        It, "raise" or "skip".

    Raises:
        ValueError: for anything else.

    Example:

    ```python
    from reckeras.datasets._files import check_on_bad_file

    check_on_bad_file("skip")   # "skip"
    ```
    """
    if not isinstance(on_bad_file, str) or on_bad_file not in ON_BAD_FILE:
        raise ValueError(f"on_bad_file must be 'raise' or 'skip', got "
                         f"{on_bad_file!r}")
    return on_bad_file


def lines_before_break(filesystem: pafs.FileSystem, path: str) -> int | None:
    """Whole lines a (decompressed) file yields before reading it fails.

    Called once a read failed, to say where: a truncated `.gz` breaks at its
    end, which no line count in pyarrow's message tells.

    Args:
        filesystem: the file's filesystem.
        path: the file.

    Returns:
        The number of complete lines read before the failure, or None when
        the file now reads to its end.

    Example:

    ```python
    from reckeras.datasets._files import lines_before_break

    lines_before_break(pafs.LocalFileSystem(), "/data/day_9.gz")   # 146335
    ```
    """
    lines = 0
    try:
        with filesystem.open_input_stream(path) as stream:
            while chunk := stream.read(_LINE_PROBE_BYTES):
                lines += chunk.count(b"\n")
    except READ_ERRORS:
        return lines
    return None


@dataclasses.dataclass(frozen=True)
class SkippedFile:
    """A file that a reader with `on_bad_file="skip"` skipped.

    Args:
        path: the file.
        reason: the error it raised, naming the file and, where known, the
            row group, stripe or line.
        when: "open" when it was found bad before any row was read (its
            footer, or the row count of a text file): it was dropped from
            the file list before sharding; "read" when it failed while its
            rows were read: the rows produced before stayed, the rest of its
            row group (parquet) or file (other formats) was skipped.

    Example:

    ```python
    logs = rk.datasets.from_parquet("/data/logs", on_bad_file="skip")
    for skipped in logs.skipped_files:
        print(skipped.path, skipped.when, skipped.reason)
    ```
    """

    path: str
    reason: str
    when: str


class BadFiles:
    """A reader's `on_bad_file` policy and the files it skipped.

    Args:
        on_bad_file: "raise" to raise the error naming a bad file; "skip" to
            log a warning, record the file in `skipped` and go on.

    Example:

    ```python
    from reckeras.datasets._files import BadFiles, file_error

    bad_files = BadFiles("skip")
    try:
        fragment.count_rows()
    except READ_ERRORS as error:
        bad_files.reject(fragment.path, file_error(fragment.path, error),
                         "open", error)
    bad_files.skipped   # [SkippedFile(path=..., reason=..., when="open")]
    ```
    """

    def __init__(self, on_bad_file: str):
        self.policy = check_on_bad_file(on_bad_file)
        self.skipped: list[SkippedFile] = []
        # Failures while reading, every time (a file that fails in every
        # epoch is recorded once): the dataset compares it before and after
        # a pass to know that rows went missing.
        self.read_failures = 0

    def reject(self, path: str, error: Exception, when: str,
               cause: BaseException | None = None) -> None:
        """Raises `error` (policy "raise"), or records and logs the skip.

        Args:
            path: the bad file.
            error: the error naming it (`file_error`).
            when: "open" or "read" (see `SkippedFile`).
            cause: the original error, chained as the raised error's cause.

        Raises:
            Exception: `error`, under the policy "raise".
        """
        if self.policy == "raise":
            raise error from cause
        if when == "read":
            self.read_failures += 1
        skipped = SkippedFile(path, str(error), when)
        if skipped in self.skipped:
            return
        self.skipped.append(skipped)
        _LOG.warning("on_bad_file='skip': skipping %s (%s): %s", path,
                     "dropped before sharding" if when == "open"
                     else "the rest of it in this pass", error)


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


def _listed_files(filesystem: pafs.FileSystem,
                  directory: str) -> dict[str, int | None]:
    """{path: size} of the files below `directory`."""
    selector = pafs.FileSelector(directory, recursive=True)
    return {info.path: info.size for info in filesystem.get_file_info(selector)
            if info.type == pafs.FileType.File}


def _relative_parts(path: str, directory: str) -> list[str]:
    return path[len(directory):].strip("/").split("/")


def _glob(filesystem: pafs.FileSystem,
          pattern: str) -> tuple[dict[str, int | None], str]:
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
        return {}, base
    files = {path.removeprefix("./") if local_relative else path: size
             for path, size in _listed_files(filesystem, listed_from).items()
             if _matches(segments[fixed:], _relative_parts(path, listed_from))}
    return files, base


def _locate_each(paths: Sequence[str | os.PathLike], filesystem: pafs.FileSystem | None,
                 suffixes: Sequence[str], what: str) -> Located:
    """`locate` of a list: the union of each entry's files."""
    if isinstance(paths, (bytes, dict)) or not len(paths):
        raise ValueError(f"expected a {what} path, directory or glob, or a non-empty "
                         f"list of them, got {paths!r}")
    parts = [locate(path, filesystem, suffixes, what) for path in paths]
    kinds = {part.filesystem.type_name for part in parts}
    if len(kinds) > 1:
        raise ValueError(f"the {what} paths {source_name(paths)!r} lie on several "
                         f"filesystems ({', '.join(sorted(kinds))}); give one list per "
                         f"filesystem")
    files = {path: size for part in parts
             for path, size in zip(part.paths, part.sizes or [None] * len(part.paths),
                                   strict=True)}
    try:
        base = posixpath.commonpath([part.base_dir for part in parts])
    except ValueError:                  # absolute and relative paths mixed
        base = ""
    ordered = sorted(files)
    return Located(parts[0].filesystem, ordered, base, [files[path] for path in ordered])


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


# What every reader takes: one path, directory or glob, or a list of them.
PathsOrGlobs = str | os.PathLike | Sequence[str | os.PathLike]


def source_name(path_or_glob: PathsOrGlobs) -> str:
    """The name a reader's `Dataset` gets from what it was given.

    Args:
        path_or_glob: a path, directory or glob, or a list of them.

    Returns:
        The path itself, or the list's paths joined by ", ".

    Example:

    ```python
    source_name(["day1.parquet", "day2.parquet"])   # "day1.parquet, day2.parquet"
    ```
    """
    if isinstance(path_or_glob, (str, os.PathLike)):
        return os.fspath(path_or_glob)
    return ", ".join(os.fspath(path) for path in path_or_glob)


def locate(path_or_glob: PathsOrGlobs, filesystem: pafs.FileSystem | None,
           suffixes: Sequence[str], what: str) -> Located:
    """The files a reader opens.

    Args:
        path_or_glob: a file, a directory (every file below it whose name
            ends with one of `suffixes`, but for hidden and `_`-prefixed
            ones), or a glob; a local path or, when `filesystem` is None, a
            URI such as "file:///data/logs". Or a list of them, on one
            filesystem: the files of each, once each; partition paths start
            below the directory they have in common.
        filesystem: the filesystem `path_or_glob` is in, or None (local, or
            read from the URI).
        suffixes: the file name endings a directory's files are kept by,
            e.g. `(".parquet",)`.
        what: the format's name, for the error message.

    Returns:
        The `Located` files, in sorted path order.

    Raises:
        FileNotFoundError: when nothing matches (naming `path_or_glob`), or
            an entry of a list matches nothing (naming it).
        ValueError: an empty list, or a list over several filesystems.

    Example:

    ```python
    from reckeras.datasets._files import locate

    located = locate("file:///data/day_*.csv", None, (".csv",), "CSV")
    ```
    """
    if not isinstance(path_or_glob, (str, os.PathLike)):
        return _locate_each(path_or_glob, filesystem, suffixes, what)
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
        info = filesystem.get_file_info(path)
        if info.type == pafs.FileType.Directory:
            base = path.rstrip("/") or "/"
            files = {
                file: size
                for file, size in _listed_files(filesystem, base).items()
                if file.endswith(tuple(suffixes)) and not any(
                    part.startswith(_SKIPPED_PREFIXES)
                    for part in _relative_parts(file, base))}
        else:
            base = path.rpartition("/")[0]
            files = {path: info.size} if info.type == pafs.FileType.File else {}
    if not files:
        raise FileNotFoundError(f"no {what} files match {pattern!r}")
    paths = sorted(files)
    return Located(filesystem, paths, base, [files[path] for path in paths])
