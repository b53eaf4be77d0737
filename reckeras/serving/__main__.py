"""`python -m reckeras.serving PATH --port N`: serves an exported model over HTTP.

The artifact is loaded (and checked) before the server listens, so a
reachable `GET /health` means the model is ready. Needs the `serving-http`
extra; imports no Keras. See `reckeras.serving.server` for the routes.

Example:

```python
# shell: python -m reckeras.serving exported/ctr --port 8501 --host 0.0.0.0
from reckeras.serving.__main__ import main

main(["exported/ctr", "--port", "8501"])      # serves until interrupted
```
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Loads the artifact at PATH and serves it until interrupted.

    Args:
        argv: the command line after the program name (`sys.argv[1:]` when
            None): `PATH [--port N] [--host H] [--threads T]
            [--torch-threads K] [--log-level L]`.

    Returns:
        The exit status: 0 after a clean shutdown, 2 when the artifact
        cannot be loaded or the serving-http extra is missing (the reason
        is printed to stderr).

    Example:

    ```python
    main(["exported/ctr", "--port", "8501", "--threads", "8"])
    ```
    """
    parser = argparse.ArgumentParser(
        prog="python -m reckeras.serving",
        description="Serve a model exported with model.export_serving(PATH) over "
                    "HTTP: POST /predict (TensorFlow Serving's REST shapes), "
                    "GET /health, GET /metadata.")
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
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    try:
        import uvicorn

        from reckeras.serving.server import create_app
    except ImportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    import torch

    from reckeras.serving import ArtifactError, load

    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)
    try:
        predictor = load(args.path)
    except ArtifactError as error:
        print(f"error: cannot serve {args.path}: {error}", file=sys.stderr)
        return 2
    uvicorn.run(create_app(predictor, threads=args.threads), host=args.host,
                port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
