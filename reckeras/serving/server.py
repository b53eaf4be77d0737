"""The HTTP server of an exported model, in TensorFlow Serving's REST shapes.

`create_app(predictor)` builds a Starlette (ASGI) app; `python -m
reckeras.serving PATH --port N` serves it with uvicorn. Both come with the
`serving-http` extra (`pip install "reckeras[serving-http]"`). Like the rest
of `reckeras.serving`, nothing here imports Keras.

Routes:

* `POST /predict`: a body in TF Serving's row format, `{"instances":
  [{feature: value, ...}, ...]}`, answered `{"predictions": [...]}` (one
  entry per instance: its output as a list, or for a model with dict outputs
  an object of them), or in its columnar format, `{"inputs": {feature:
  [values...]}}`, answered `{"outputs": ...}` (the output as a nested list,
  or an object of them). A missing value is `null`.
* `POST /retrieve` (a retrieval artifact's only): the query columns in
  either format, with `"k"` (default 10, at most the server's max) and an
  optional `"exclude"` (one list of item ids per row), answered
  `{"predictions": [{"item_ids": [...], "scores": [...]}, ...]}` (row
  format) or `{"outputs": {"item_ids": [[...]], "scores": [[...]]}}`
  (columnar): best first, a score the cosine, an empty slot `-1` and
  `-Infinity`. `/predict` answers the query vectors.
* `GET /health`: `{"status": "ok", "version": ..., "rows_written_at": ...,
  "rows_age_s": ...}` once the artifact is loaded: the served model version
  and when its newest rows were read from training (and how long ago).
* `GET /metadata`: the features (name, kind, dtype, shape or max_len,
  weights column), the raw columns a request holds, the outputs, the
  artifact's versions and the served model version.

Every `/predict` and `/retrieve` answer carries the model version that computed it in the
`X-Model-Version` header. Deltas reach a running server through
`create_admin_app` (an app of its own, for a second listener: never the
public port) or a `watch.DeltaWatcher`.

A request the model cannot read (malformed JSON, neither or both of
`instances`/`inputs`, a missing feature, a wrong type, a bad value) gets a
400 `{"error": "..."}` naming the feature; anything else that fails gets a
500 `{"error": "..."}` and is logged; the server goes on serving either way.
Predictions run in worker threads (`Predictor.predict` is thread-safe), so
the event loop keeps accepting requests while a batch runs.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from typing import Any

import numpy as np
import pyarrow as pa

try:
    from anyio import CapacityLimiter, to_thread
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route
except ImportError as error:      # the extra is optional: say how to get it
    raise ImportError(f"the HTTP server needs the serving-http extra: pip install "
                      f"'reckeras[serving-http]' ({error})") from error

from reckeras.features.encode import FeatureInputError, rows_to_columns
from reckeras.features.specs import Categorical, Cross, Numeric, Sequence
from reckeras.serving.artifact import DeltaError
from reckeras.serving.predictor import Predictor
from reckeras.serving.retrieval import RetrievalPredictor

logger = logging.getLogger("reckeras.serving")
VERSION_HEADER = "X-Model-Version"


class RequestError(ValueError):
    """A request body that is not a predict request the model can read.

    The server answers it with a 400; the message names the feature or the
    part of the body at fault.

    Example:

    ```python
    from reckeras.serving.server import RequestError, parse_request

    try:
        parse_request(b'{"instances": [1, 2]}', ["I1"])
    except RequestError as error:
        print(error)   # instance 0 is not an object of features ...
    ```
    """


def parse_request(body: bytes, columns: list[str]) -> tuple[str, dict[str, list]]:
    """Reads a TF Serving predict body into the columns a `Predictor` takes.

    Args:
        body: the request body, JSON: `{"instances": [{...}, ...]}` (row
            format) or `{"inputs": {name: [...], ...}}` (columnar format);
            an optional `"signature_name"` must be `"serving_default"`.
        columns: the raw columns the model reads (`Predictor.input_columns`);
            other keys of the body's objects are ignored.

    Returns:
        `("instances" or "inputs", columns)`: the format the body used and a
        dict of per-example lists, keyed by column. A column no instance
        holds is left out (the predictor names it as missing).

    Raises:
        RequestError: the body is not JSON, has neither or both of the two
            keys, an instance that is not an object, a column that is not a
            list or whose length differs from the others, or an instance
            that lacks a feature the others hold (each named).

    Example:

    ```python
    parse_request(b'{"instances": [{"I1": 1.0, "C1": 7}, {"I1": 2.0, "C1": null}]}',
                  ["I1", "C1"])
    # ("instances", {"I1": [1.0, 2.0], "C1": [7, None]})
    ```
    """
    return _read_object(_json_object(body), columns, ())[:2]


def _json_object(body: bytes) -> dict:
    try:
        request = json.loads(body)
    except (ValueError, RecursionError) as error:     # bad bytes, syntax, nesting
        raise RequestError(f"the request body is not JSON ({error})") from None
    if not isinstance(request, dict):
        raise RequestError(f"the request body must be a JSON object with "
                           f"'instances' or 'inputs', got {type(request).__name__}")
    return request


def _read_object(request: dict, columns: list[str], own_keys: tuple[str, ...]
                 ) -> tuple[str, dict[str, list], int]:
    """`(form, columns, rows)` of a request object whose other keys are
    `own_keys` (the route's own)."""
    unknown = sorted(set(request) - {"instances", "inputs", "signature_name", *own_keys})
    if unknown:
        raise RequestError(f"unknown key(s) {unknown}: a request holds 'instances' or "
                           f"'inputs' (and {['signature_name', *own_keys]})")
    signature = request.get("signature_name", "serving_default")
    if signature != "serving_default":
        raise RequestError(f"signature_name {signature!r}: the model has one "
                           f"signature, 'serving_default'")
    if ("instances" in request) == ("inputs" in request):
        raise RequestError("a request holds exactly one of 'instances' "
                           "(row format) and 'inputs' (columnar format)")
    if "instances" in request:
        batch = _rows_to_columns(request["instances"], columns)
        return "instances", batch, len(request["instances"])
    batch = _columns(request["inputs"], columns)
    return "inputs", batch, len(next(iter(batch.values()))) if batch else 0


def parse_retrieve_request(body: bytes, columns: list[str], max_k: int
                           ) -> tuple[str, dict[str, list], int, list | None]:
    """Reads a `POST /retrieve` body: a predict body plus `k` and `exclude`.

    Args:
        body: JSON, `{"instances": [...]}` or `{"inputs": {...}}` of the
            query columns, as `/predict` takes them, with `"k"` (an int in
            [1, max_k], default 10) and optionally `"exclude"`: one list of
            item ids per query row (ids to leave out, e.g. the history).
        columns: the raw columns the query tower reads.
        max_k: the largest `k` the server answers.

    Returns:
        `(form, columns, k, exclude or None)`.

    Raises:
        RequestError: as `parse_request`, or a bad `k` or `exclude` (named).

    Example:

    ```python
    parse_retrieve_request(b'{"instances": [{"user_id": 7}], "k": 5, '
                           b'"exclude": [[3, 4]]}', ["user_id"], 1000)
    # ("instances", {"user_id": [7]}, 5, [[3, 4]])
    ```
    """
    request = _json_object(body)
    form, batch, rows = _read_object(request, columns, ("k", "exclude"))
    k = request.get("k", 10)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= max_k:
        raise RequestError(f"'k' must be an int from 1 to {max_k} (the server's "
                           f"--max-k), got {k!r}")
    exclude = request.get("exclude")
    if exclude is not None and (not isinstance(exclude, list) or len(exclude) != rows or not all(
            isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                          for i in ids) for ids in exclude)):
        raise RequestError(f"'exclude' must be a list of {rows} lists of int item ids, "
                           f"one per query row")
    return form, batch, k, exclude


def _rows_to_columns(instances: Any, columns: list[str]) -> dict[str, list]:
    if not isinstance(instances, list):
        raise RequestError(f"'instances' must be a list of objects, one per "
                           f"example, got {type(instances).__name__}")
    return rows_to_columns(instances, columns)


def _columns(inputs: Any, columns: list[str]) -> dict[str, list]:
    if not isinstance(inputs, dict):
        raise RequestError(f"'inputs' must be an object {{feature: [values...]}}, "
                           f"got {type(inputs).__name__}")
    batch = {}
    for name in columns:
        if name not in inputs:
            continue
        values = inputs[name]
        if not isinstance(values, list):
            raise RequestError(f"feature {name!r}: expected a list of values, one "
                               f"per example, got {type(values).__name__}")
        batch[name] = values
    if batch:
        first, rows = next((name, len(values)) for name, values in batch.items())
        for name, values in batch.items():
            if len(values) != rows:
                raise RequestError(f"feature {name!r}: {len(values)} values, but "
                                   f"{first!r} has {rows}")
    return batch


def null_types(specs: list) -> dict[str, pa.DataType]:
    """The arrow type of each raw column, for a column of JSON nulls only.

    A column of nothing but `null`s (or of empty lists) has no type of its
    own (pyarrow reads it as `null`, or a list of `null`), so it gets its
    feature's: a batch whose examples all miss a Categorical, or a
    one-example batch missing it, then predicts like any other missing
    value.

    Args:
        specs: the feature specs (`Predictor.specs`).

    Returns:
        A dict from raw column name to its type: float32 for a Numeric
        (a list of float32 for a vector), int64 or string for a
        Categorical's ids, float64 for a bucketized one, a list of the ids'
        type for a Sequence and of float32 for its weights.

    Example:

    ```python
    null_types([rk.features.Categorical("C1", dim=8)])   # {"C1": pa.int64()}
    ```
    """
    types = {}
    for spec in specs:
        ids = pa.string() if getattr(spec, "dtype", None) == "string" else pa.int64()
        if isinstance(spec, Numeric):
            types[spec.name] = pa.list_(pa.float32()) if spec.shape else pa.float32()
        elif isinstance(spec, Categorical):
            types[spec.name] = pa.float64() if spec.boundaries is not None else ids
        elif isinstance(spec, Sequence):
            types[spec.name] = pa.list_(ids)
            if spec.weights is not None:
                types[spec.weights] = pa.list_(pa.float32())
    return types


def _typed(values: list, type_: pa.DataType) -> pa.Array | list:
    """The column of JSON values, typed as its feature's when it holds only
    nulls (or empty lists); as given when pyarrow cannot read it, for
    `encode` to report, naming the feature."""
    try:
        column = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return values
    untyped = column.type
    if pa.types.is_list(untyped):
        untyped = untyped.value_type
    return column.cast(type_) if pa.types.is_null(untyped) else column


def format_response(form: str, outputs: np.ndarray | dict[str, np.ndarray]
                    ) -> dict[str, Any]:
    """The TF Serving response body for a predictor's outputs.

    Args:
        form: `"instances"` (row format) or `"inputs"` (columnar format), as
            `parse_request` returned.
        outputs: `Predictor.predict`'s result: an array `[B, ...]` or a dict
            of them.

    Returns:
        Row format: `{"predictions": [...]}`, one entry per example: its
        output as a (nested) list, or an object of its outputs. Columnar:
        `{"outputs": ...}`, the output as a nested list, or an object of them.

    Example:

    ```python
    format_response("instances", np.array([[0.73], [0.12]], np.float32))
    # {"predictions": [[0.73...], [0.12...]]}
    format_response("inputs", {"ctr": np.array([[0.5]]), "cvr": np.array([[0.1]])})
    # {"outputs": {"ctr": [[0.5]], "cvr": [[0.1]]}}
    ```
    """
    if form == "inputs":
        if isinstance(outputs, dict):
            return {"outputs": {name: value.tolist() for name, value in outputs.items()}}
        return {"outputs": outputs.tolist()}
    if isinstance(outputs, dict):
        lists = {name: value.tolist() for name, value in outputs.items()}
        rows = len(next(iter(lists.values())))
        return {"predictions": [{name: value[i] for name, value in lists.items()}
                                for i in range(rows)]}
    return {"predictions": outputs.tolist()}


def metadata(predictor: Predictor) -> dict[str, Any]:
    """What `GET /metadata` answers: the features, columns, outputs, versions.

    Args:
        predictor: the loaded model.

    Returns:
        `{"features": [...], "columns": [...], "outputs": ..., "format":
        ..., "format_version": ..., "versions": {...}, "rows": ...}` (the
        server adds the served `"version"` to each answer). Each
        feature has its `name` and `kind`; a Numeric its `dtype` (float32)
        and `shape`, a Categorical its `dtype` (`int64` or `string` ids, or
        float32 with its `boundaries`), a Sequence its `dtype`, `max_len`
        and `weights` column (or null), a Cross the `features` it crosses
        (it reads no column of its own). `columns` are the raw columns a
        request holds; `outputs` the names of a dict-output model's outputs,
        or null; `retrieval` null for a ranking artifact, else the corpus
        (`num_items`, `dim`, the query and candidate features) and the
        `index` (`"exact"`, `"hnsw"` or `"ivf"`) with its `index_options`.

    Example:

    ```python
    metadata(reckeras.serving.load("exported/ctr"))["columns"]   # ["I1", "C1"]
    ```
    """
    features = []
    for spec in predictor.specs:
        entry: dict[str, Any] = {"name": spec.name, "kind": type(spec).__name__}
        if isinstance(spec, Numeric):
            entry.update(dtype="float32", shape=list(spec.shape))
        elif isinstance(spec, Categorical) and spec.boundaries is not None:
            entry.update(dtype="float32", boundaries=list(spec.boundaries))
        elif isinstance(spec, Categorical):
            entry.update(dtype=spec.dtype)
        elif isinstance(spec, Sequence):
            entry.update(dtype=spec.dtype, max_len=spec.max_len, weights=spec.weights)
        elif isinstance(spec, Cross):
            entry.update(features=list(spec.names))
        features.append(entry)
    manifest = predictor.manifest
    retrieval = None
    if isinstance(predictor, RetrievalPredictor):
        retrieval = {**manifest["retrieval"], "index": predictor.index_kind,
                     "index_options": None if predictor.index is None
                     else predictor.index.options}
    return {"features": features, "columns": predictor.input_columns,
            "outputs": predictor.outputs, "format": manifest["format"],
            "format_version": manifest["format_version"],
            "versions": manifest["versions"], "rows": manifest["rows"],
            "retrieval": retrieval}


def health(predictor: Predictor) -> dict[str, Any]:
    """What `GET /health` answers: the served version and its rows' age.

    Args:
        predictor: the served model.

    Returns:
        `{"status": "ok", "version": ..., "rows_written_at": ...,
        "rows_age_s": ...}`: the version answering requests now, when its
        export read the rows from training (seconds since the epoch) and
        how many seconds ago that was.

    Example:

    ```python
    health(predictor)["rows_age_s"]    # 42.7: the rows are 43 s old
    ```
    """
    served = predictor.served
    return {"status": "ok", "version": served.version,
            "rows_written_at": served.rows_written_at,
            "rows_age_s": None if served.rows_written_at is None
            else time.time() - served.rows_written_at}


def _json(content: Any, status: int = 200, headers: dict[str, str] | None = None
          ) -> Response:
    # TF Serving writes NaN/Infinity tokens for non-finite floats; Starlette's
    # JSONResponse refuses them (a 500), so the body is written here.
    return Response(json.dumps(content, allow_nan=True, separators=(",", ":")),
                    status_code=status, media_type="application/json", headers=headers)


async def _http_error(request: Request, error: HTTPException) -> Response:
    # 404/405 in TF Serving's error shape rather than Starlette's plain text.
    return _json({"error": f"{request.method} {request.url.path}: {error.detail}"},
                 error.status_code)


def create_app(predictor: Predictor, threads: int = 4, max_k: int = 1000) -> Starlette:
    """The ASGI app serving a predictor.

    Args:
        predictor: the loaded model (`reckeras.serving.load(path)`).
        threads: how many predictions run at once, each in a worker thread;
            more requests wait for a free one. Each prediction also uses
            torch's intra-op threads (`torch.set_num_threads`).
        max_k: the largest `k` a `POST /retrieve` may ask for.

    Returns:
        A Starlette app with the routes `POST /predict`, `GET /health` and
        `GET /metadata`, and `POST /retrieve` for a `RetrievalPredictor`;
        run it with any ASGI server (uvicorn, as `python -m
        reckeras.serving` does).

    Raises:
        ValueError: `threads` or `max_k` is below 1.

    Example:

    ```python
    import uvicorn
    from reckeras.serving import load
    from reckeras.serving.server import create_app

    uvicorn.run(create_app(load("exported/ctr")), host="127.0.0.1", port=8501)
    ```
    """
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    if max_k < 1:
        raise ValueError(f"max_k must be at least 1, got {max_k}")
    limiter = CapacityLimiter(threads)
    columns = predictor.input_columns
    described = metadata(predictor)
    types = null_types(predictor.specs)

    def run(body):
        form, batch = parse_request(body, columns)
        for name, values in batch.items():
            batch[name] = _typed(values, types[name])
        outputs, version = predictor.predict_with_version(batch)
        return format_response(form, outputs), version

    def answering(work, route):
        async def answer(request: Request) -> Response:
            body = await request.body()
            try:
                # Parsing a large body is work too: it goes to the thread as well.
                content, version = await to_thread.run_sync(work, body, limiter=limiter)
                return _json(content, headers={VERSION_HEADER: version})
            except (RequestError, FeatureInputError) as error:
                return _json({"error": str(error)}, 400)
            except Exception as error:      # the server outlives any one request
                logger.exception("POST %s failed", route)
                return _json({"error": f"internal error: {type(error).__name__}: "
                                       f"{error}"}, 500)
        return answer

    async def healthy(request: Request) -> Response:
        return _json(health(predictor))

    async def describe(request: Request) -> Response:
        return _json({**described, "version": predictor.version})

    routes = [Route("/predict", answering(run, "/predict"), methods=["POST"]),
              Route("/health", healthy, methods=["GET"]),
              Route("/metadata", describe, methods=["GET"])]
    if isinstance(predictor, RetrievalPredictor):
        routes.append(Route("/retrieve", answering(
            _retrieving(predictor, columns, types, max_k), "/retrieve"), methods=["POST"]))
    return Starlette(routes=routes,
                     # Starlette types every handler as taking any Exception; it
                     # calls this one, registered for HTTPException, with those only.
                     exception_handlers={HTTPException: _http_error})  # type: ignore[dict-item]


def _retrieving(predictor: RetrievalPredictor, columns: list[str],
                types: dict[str, pa.DataType], max_k: int) -> Any:
    """`POST /retrieve`'s work on a body: `(response, version)`."""
    def retrieve(body):
        form, batch, k, exclude = parse_retrieve_request(body, columns, max_k)
        for name, values in batch.items():
            batch[name] = _typed(values, types[name])
        item_ids, scores, version = predictor.retrieve_with_version(batch, k, exclude)
        return format_response(form, {"item_ids": item_ids, "scores": scores}), version
    return retrieve


def create_admin_app(predictor: Predictor, token: str) -> Starlette:
    """The admin ASGI app: applies deltas to the running predictor.

    Serve it on a listener of its own, bound to localhost (as `python -m
    reckeras.serving --admin-port N` does), never on the public port.

    Route: `POST /delta` with the header `Authorization: Bearer <token>`
    and the body `{"path": "<delta directory on the server's disk>"}`:
    200 `{"version": <new version>}` once applied; 401 for a missing or
    wrong token (compared in constant time); 400 for a body without a
    `path`; 409 `{"error": ..., "version": <still served>}` for a delta
    refused (`DeltaError`: damaged, partial, out of order).

    Args:
        predictor: the served model.
        token: the secret a request must present (at least 16 characters).

    Returns:
        A Starlette app.

    Raises:
        ValueError: a token shorter than 16 characters.

    Example:

    ```python
    admin = create_admin_app(predictor, token=os.environ["RECKERAS_ADMIN_TOKEN"])
    uvicorn.run(admin, host="127.0.0.1", port=8502)
    ```
    """
    if len(token) < 16:
        raise ValueError("the admin token must hold at least 16 characters")
    expected = f"Bearer {token}".encode()

    async def apply(request: Request) -> Response:
        presented = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(presented, expected):
            return _json({"error": "POST /delta needs 'Authorization: Bearer <token>' "
                                   "with the server's admin token"}, 401)
        try:
            path = json.loads(await request.body())["path"]
            if not isinstance(path, str):
                raise TypeError(type(path).__name__)
        except (ValueError, KeyError, TypeError) as error:
            return _json({"error": f"the body must be {{\"path\": \"<delta "
                                   f"directory>\"}} ({error!r})"}, 400)
        try:
            # Building the next version is work: off the event loop.
            version = await to_thread.run_sync(predictor.apply_delta, path)
        except DeltaError as error:
            logger.error("delta refused, still serving %s: %s", predictor.version, error)
            return _json({"error": str(error), "version": predictor.version}, 409)
        logger.info("applied delta %s from %s", version, path)
        return _json({"version": version})

    return Starlette(routes=[Route("/delta", apply, methods=["POST"])],
                     exception_handlers={HTTPException: _http_error})  # type: ignore[dict-item]
