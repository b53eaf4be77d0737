"""`python -m reckeras.serving PATH --port N`: serves an exported model over HTTP.

The artifact is loaded (and checked) before the server listens, so a
reachable `GET /health` means the model is ready. Deltas are picked up from
`--watch DIR` (polled every `--watch-interval` seconds) and/or the admin
endpoint, off unless `--admin-port` is given: a second listener (localhost
by default) whose token is read from the environment variable
`RECKERAS_ADMIN_TOKEN`. Needs the `serving-http` extra; imports no Keras.
See `reckeras.serving.server` for the routes.

Example:

```python
# shell: python -m reckeras.serving exported/ctr --port 8501 --host 0.0.0.0
from reckeras.serving.__main__ import main

main(["exported/ctr", "--port", "8501"])      # serves until interrupted
```
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

ADMIN_TOKEN_VARIABLE = "RECKERAS_ADMIN_TOKEN"


def main(argv: list[str] | None = None) -> int:
    """Loads the artifact at PATH and serves it until interrupted.

    Args:
        argv: the command line after the program name (`sys.argv[1:]` when
            None): `PATH [--port N] [--host H] [--threads T]
            [--torch-threads K] [--log-level L] [--watch DIR]
            [--watch-interval S] [--admin-port N] [--admin-host H]
            [--index exact|hnsw|ivf] [--index-options JSON] [--max-k K]`.

    Returns:
        The exit status: 0 after a clean shutdown, 2 when the artifact
        cannot be loaded (or its index built), the watched directory does not exist, the admin
        port has no token in `RECKERAS_ADMIN_TOKEN`, or the serving-http
        extra is missing (the reason is printed to stderr).

    Example:

    ```python
    main(["exported/ctr", "--port", "8501", "--threads", "8"])
    ```
    """
    parser = argparse.ArgumentParser(
        prog="python -m reckeras.serving",
        description="Serve a model exported with model.export_serving(PATH) over "
                    "HTTP: POST /predict (TensorFlow Serving's REST shapes), "
                    "GET /health, GET /metadata; a two-tower's retrieval artifact "
                    "adds POST /retrieve.")
    parser.add_argument("path", metavar="PATH", help="the artifact directory")
    parser.add_argument("--port", type=int, default=8501,
                        help="port to listen on (default: 8501, TF Serving's REST port)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default: 127.0.0.1; 0.0.0.0 for all)")
    parser.add_argument("--threads", type=int, default=4,
                        help="predictions run at once, each in a worker thread "
                             "(default: 4)")
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="torch's intra-op threads per prediction (default: "
                             "torch's own)")
    parser.add_argument("--log-level", default="info",
                        choices=["critical", "error", "warning", "info", "debug"])
    parser.add_argument("--watch", metavar="DIR", default=None,
                        help="apply the deltas written into DIR (one directory each) "
                             "as they appear, in chain order")
    parser.add_argument("--watch-interval", type=float, default=1.0,
                        help="seconds between two looks at --watch (default: 1)")
    parser.add_argument("--admin-port", type=int, default=None,
                        help=f"serve POST /delta on this second port (default: off); "
                             f"the token is read from ${ADMIN_TOKEN_VARIABLE}")
    parser.add_argument("--admin-host", default="127.0.0.1",
                        help="address the admin port binds (default: 127.0.0.1)")
    parser.add_argument("--index", default="exact", choices=["exact", "hnsw", "ivf"],
                        help="how POST /retrieve searches a retrieval artifact's corpus: "
                             "exact brute force (default) or a faiss index (the ann extra)")
    parser.add_argument("--index-options", type=json.loads, default=None, metavar="JSON",
                        help='the ANN index\'s options, e.g. \'{"ef_search": 256}\' '
                             "(see docs/retrieval.md for the defaults)")
    parser.add_argument("--max-k", type=int, default=1000,
                        help="the largest k a POST /retrieve may ask for (default: 1000)")
    args = parser.parse_args(argv)
    if args.max_k < 1:
        parser.error(f"--max-k must be at least 1, got {args.max_k}")
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    if args.watch_interval <= 0:
        parser.error(f"--watch-interval must be > 0, got {args.watch_interval}")
    if args.admin_port is not None and args.admin_port == args.port:
        parser.error("--admin-port must differ from --port: the admin endpoint is never "
                     "served on the public port")
    token = os.environ.get(ADMIN_TOKEN_VARIABLE, "")
    if args.admin_port is not None and len(token) < 16:
        print(f"error: --admin-port needs a token of at least 16 characters in "
              f"${ADMIN_TOKEN_VARIABLE}", file=sys.stderr)
        return 2
    try:
        import uvicorn

        from reckeras.serving.server import create_admin_app, create_app
    except ImportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    import torch

    from reckeras.serving import ArtifactError, load
    from reckeras.serving.watch import DeltaWatcher

    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)
    try:
        predictor = load(args.path, args.index, args.index_options)
    except (ArtifactError, ValueError, ImportError) as error:
        print(f"error: cannot serve {args.path}: {error}", file=sys.stderr)
        return 2
    watcher = None
    if args.watch is not None:
        try:
            watcher = DeltaWatcher(predictor, args.watch, args.watch_interval)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        watcher.poll()          # what is there already, before listening
        watcher.start()
    servers = [uvicorn.Server(uvicorn.Config(
        create_app(predictor, threads=args.threads, max_k=args.max_k), host=args.host,
        port=args.port, log_level=args.log_level))]
    if args.admin_port is not None:
        servers.append(uvicorn.Server(uvicorn.Config(
            create_admin_app(predictor, token), host=args.admin_host, port=args.admin_port,
            log_level=args.log_level)))
    try:
        asyncio.run(_serve(servers))
    finally:
        if watcher is not None:
            watcher.stop()
    return 0


async def _serve(servers: list) -> None:
    """Runs the listeners until one stops (a signal reaches only one of
    them), then stops the others."""
    running = [asyncio.ensure_future(server.serve()) for server in servers]
    await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
    for server in servers:
        server.should_exit = True
    await asyncio.gather(*running)


if __name__ == "__main__":
    sys.exit(main())
