"""What goes where when a checkpoint loads: the model's table each saved
table's rows go to (by position, or by name for a warm start, with renamed
tables re-keyed), the table files each rank reads, and which link of a
chain each row comes from.

Loading on M ranks: each rank keeps the keys it owns under M ranks
(`sharding.owner_of`), so any N -> M works, link by link (the links of a
chain may come from different world sizes). It reads only the files that
can hold rows it owns: file r of N when r = rank (mod gcd(N, M)), so all of
them when N and M are coprime, one when N = M. Of a chain, a row comes
from the last link that holds it, unless a later link deleted it.

A warm start (`load_checkpoint(..., warm_start=True)`) matches tables by
name (`rename_tables` maps old names to new ones; a renamed table's keys are
re-salted, `key ^ salt(old) ^ salt(new)`); tables the checkpoint lacks start
fresh, tables the model lacks are reported and skipped, a table whose dim
changed is an error naming it.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from reckeras.checkpoint.format import FORMAT_VERSION, INDEX, CheckpointError
from reckeras.embedding.packing import table_salt
from reckeras.embedding.table_state import TableLayout


@dataclasses.dataclass
class LoadReport:
    """What `load_checkpoint` loaded, and for a warm start what it did not.

    Args:
        chain: the checkpoint directories read, the full one first (one
            entry for a full checkpoint).
        warm_start: whether tables and variables were matched by name.
        added_tables: tables of the model the checkpoint has none of
            (they start with fresh rows).
        removed_tables: tables of the checkpoint the model lacks (skipped).
        renamed_tables: `{checkpoint table: model table}` whose rows were
            re-keyed.
        added_variables: dense variable paths the checkpoint lacks (they
            keep the model's values).
        removed_variables: dense variable paths of the checkpoint the model
            lacks (skipped).
        skipped_variables: dense variables whose shape differs, kept at the
            model's values (`skip_mismatch=True`).

    Example:

    ```python
    report = model.load_checkpoint("ckpt/full", warm_start=True)
    print(report.added_tables, report.removed_tables)
    ```
    """

    chain: list[str]
    warm_start: bool = False
    added_tables: list[str] = dataclasses.field(default_factory=list)
    removed_tables: list[str] = dataclasses.field(default_factory=list)
    renamed_tables: dict[str, str] = dataclasses.field(default_factory=dict)
    added_variables: list[str] = dataclasses.field(default_factory=list)
    removed_variables: list[str] = dataclasses.field(default_factory=list)
    skipped_variables: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Route:
    """Where the rows of one saved physical table go, per saved tag (each
    array has one entry per table of `tables`, then one for rows whose
    table is unknown, tag -1).

    Args:
        tables: the saved physical table's logical tables.
        width: its optimizer state values per row.
        target: the model's physical table (same layer and dim) or None.
        xor: what each tag's keys are xored with.
        kept: whether each tag's rows load.
        tag: each saved tag's tag in the model.
        untagged: the tag of rows a file has no tags for.

    `target` is the model's physical table (same layer and dim) or None;
    a row of tag i is kept if `kept[i]`, its key becomes `key ^ xor[i]` and
    its tag `tag[i]`. Rows a file has no tags for have tag `untagged`.
    """

    tables: list
    width: int
    target: int | None
    xor: np.ndarray
    kept: np.ndarray
    tag: np.ndarray
    untagged: int

    @classmethod
    def empty(cls, tables: list[str], width: int) -> Route:
        """A route that loads nothing yet.

        Args:
            tables: the saved physical table's logical tables.
            width: its optimizer state values per row.

        Returns:
            The route, every tag dropped.
        """
        count = len(tables)
        return cls(list(tables), width, None, np.zeros(count + 1, np.int64),
                   np.zeros(count + 1, bool), np.full(count + 1, -1, np.int32),
                   0 if count == 1 else -1)


def routes(layouts: list[list[TableLayout]], chain: list, warm_start: bool,
           rename: dict, report: LoadReport) -> list[list[Route]]:
    """Per saved layer, the `Route` of each saved physical table.

    Args:
        layouts: the model's tables, per embedding layer.
        chain: `[(directory, index)]` of the links, the full one first.
        warm_start: match tables by name.
        rename: `rename_tables` of a warm start.
        report: the `LoadReport` a warm start fills.

    Returns:
        The routes.

    Raises:
        CheckpointError: the checkpoint's tables do not fit the model.
        ValueError: `rename` names a table neither side has.
    """
    path, index = chain[-1]
    saved = index["layers"]
    expected = [[layout.dim for layout in layer] for layer in layouts]
    found = [[t["dim"] for t in layer] for layer in saved]
    version = index["format_version"]
    if not warm_start:
        if expected != found:
            raise CheckpointError(f"checkpoint {path!r} holds tables of dims {found}, the "
                                  f"model has {expected}")
        names = [[t["tables"] for t in layer] for layer in saved] if version >= 3 else None
        model_names = [[list(layout.tables) for layout in layer] for layer in layouts]
        if names is not None and names != model_names:
            raise CheckpointError(f"checkpoint {path!r} holds tables {names}, the model has "
                                  f"{model_names}: load it with warm_start=True to match "
                                  f"them by name")
        found_routes: list[list[Route]] = []
        for layer, groups in zip(saved, model_names, strict=True):
            found_routes.append([])
            for target, (entry, group) in enumerate(zip(layer, groups, strict=True)):
                route = Route.empty(group, entry["state_width"])
                route.target = target
                route.kept[:] = True
                route.tag[:-1] = np.arange(len(group))
                found_routes[-1].append(route)
    else:
        if version < 3:
            raise CheckpointError(
                f"{os.path.join(path, INDEX)} is of format {version}, which does not name "
                f"its tables: a warm start needs format {FORMAT_VERSION} (load it into the "
                f"model it was saved from and save it again)")
        if len(saved) != len(layouts):
            raise CheckpointError(f"checkpoint {path!r} has {len(saved)} embedding layers, "
                                  f"the model has {len(layouts)}: a warm start matches "
                                  f"tables layer by layer")
        found_routes = _warm_routes(layouts, path, saved, rename, report)
    for layer, layer_routes in zip(layouts, found_routes, strict=True):
        for route in layer_routes:
            layout = None if route.target is None else layer[route.target]
            if layout is not None and layout.state_width not in (0, route.width):
                raise CheckpointError(
                    f"checkpoint {path!r}: table {layout.name} was saved with "
                    f"{route.width} optimizer state values per row, the model's sparse "
                    f"optimizer keeps {layout.state_width}")
    return found_routes


def _warm_routes(layouts, path, saved, rename, report):
    """`routes` of a warm start: tables matched by name, renamed by `rename`."""
    groups = [[list(layout.tables) for layout in layer] for layer in layouts]
    saved_names = sorted({n for layer in saved for t in layer for n in t["tables"]})
    model_names = sorted({n for layer in groups for group in layer for n in group})
    unknown = sorted(set(rename) - set(saved_names))
    if unknown:
        raise ValueError(f"rename_tables names {unknown}, which checkpoint {path!r} does "
                         f"not have; its tables are {saved_names}")
    missing = sorted({n for n in rename.values() if n is not None} - set(model_names))
    if missing:
        raise ValueError(f"rename_tables maps to {missing}, which the model does not have; "
                         f"its tables are {model_names}")
    routes = []
    for layer, saved_layer, layer_groups in zip(layouts, saved, groups, strict=True):
        place = {name: (target, tag) for target, group in enumerate(layer_groups)
                 for tag, name in enumerate(group)}
        sources = {}              # the model's table -> the checkpoint's that loads into it
        routes.append([])
        for entry in saved_layer:
            route = Route.empty(entry["tables"], entry["state_width"])
            for i, name in enumerate(entry["tables"]):
                new = rename.get(name, name)
                if new not in place:
                    report.removed_tables.append(name)
                    continue
                if new in sources:
                    raise CheckpointError(
                        f"checkpoint {path!r}: tables {sources[new]!r} and {name!r} would "
                        f"both load into table {new!r}; map one of them elsewhere in "
                        f"rename_tables (or to None)")
                sources[new] = name
                target, tag = place[new]
                dim = layer[target].dim
                if dim != entry["dim"]:
                    raise CheckpointError(
                        f"checkpoint {path!r}: table {name!r} has dim {entry['dim']}, the "
                        f"model's table {new!r} has dim {dim}; a table whose dim changed "
                        f"cannot be warm-started (rename_tables={{{name!r}: None}} starts "
                        f"it fresh)")
                route.target = target
                route.xor[i] = table_salt(name) ^ table_salt(new)
                route.kept[i], route.tag[i] = True, tag
                if new != name:
                    report.renamed_tables[name] = new
            # Rows of an unknown table load only where nothing changes for them.
            route.kept[-1] = route.target is not None \
                and layer_groups[route.target] == entry["tables"] \
                and not route.xor.any() \
                and route.tag[:-1].tolist() == list(range(len(entry["tables"])))
            routes[-1].append(route)
        report.added_tables += [n for group in layer_groups for n in group
                                if n not in sources]
    return routes


def files_to_read(index: dict, rank: int, world_size: int, resalted: bool) -> list[str]:
    """The table files of one link that can hold rows rank `rank` owns.

    The owner of a key is h mod (world size) for one hash h (`owner_of`), so
    file r of N holds h = r (mod N); rank m of M owns h = m (mod M); both
    hold for some h exactly when r = m (mod gcd(N, M)). A re-salted key has
    another owner: every file is read then.

    Args:
        index: the link's index.
        rank: this rank.
        world_size: the ranks loading.
        resalted: some keys are re-salted (a warm start renames tables).

    Returns:
        The file names.
    """
    common = 1 if resalted else math.gcd(index["world_size"], world_size)
    return [name for r, name in enumerate(index["table_files"])
            if r % common == rank % common]


def drop_overridden(links: list, routes: list[list[Route]], chosen: dict, found: dict,
                    deleted: dict) -> None:
    """Of a chain, keeps each row from the last link that holds it, and none
    that a later link deleted (`chosen` and `found` are narrowed in place).

    Args:
        links: `[(directory, index, file names this rank reads)]`.
        routes: the routes, per saved layer.
        chosen: `(link, file, layer, table) -> mask` of the rows loaded.
        found: `(link, layer, table) -> [(saved keys, keys, tags)]` per file.
        deleted: `(link, layer, table) -> [deleted keys]` per file.
    """
    if len(links) == 1:
        return
    for li, layer in enumerate(routes):
        for t in range(len(layer)):
            later = np.empty(0, np.int64)     # keys a later link holds or deleted
            for i in reversed(range(len(links))):
                parts = found.get((i, li, t), [])
                if later.size and parts:
                    survives = ~np.isin(np.concatenate([part[0] for part in parts]), later)
                    start = 0
                    for f, (name, (saved, keys, tags)) in enumerate(
                            zip(links[i][2], parts, strict=True)):
                        keep = survives[start:start + saved.size]
                        start += saved.size
                        mask = chosen[i, name, li, t]
                        mask[np.flatnonzero(mask)[~keep]] = False
                        kept = saved[keep]
                        parts[f] = (kept, kept if keys is saved else keys[keep], tags[keep])
                if i:
                    later = np.union1d(later, np.concatenate(
                        [part[0] for part in parts] + deleted.get((i, li, t), [])
                        + [np.empty(0, np.int64)]))
