"""Regenerates the packaged parquet files: `python -m reckeras.datasets.build`.

Every split of every synthetic dataset is written with its default size and
seed by `generate`, so the packaged files are reproducible bit for bit.
"""

from reckeras.datasets import _registry, _synth, aliccp, longtail, retrieval, taobao


def main() -> None:
    """Writes every packaged split into `reckeras/datasets/data`.

    Prints each file's path, rows and size. It overwrites the packaged
    files, with the same bytes unless the generators changed.

    Example:

    ```python
    # From a shell: python -m reckeras.datasets.build
    from reckeras.datasets.build import main

    main()
    ```
    """
    for name, spec in sorted(_synth.SPECS.items()):
        for split, rows in spec.default_rows.items():
            path = _registry.packaged_path(name, split)
            _registry.generate(name, rows, path, split=split)
            print(f"{path}: {rows} rows, {path.stat().st_size / 2**20:.2f} MiB")
    for module in (taobao, aliccp, longtail, retrieval):
        for split, rows in module.DEFAULT_ROWS.items():
            path = _registry.packaged_path(module.NAME, split)
            _registry.generate(module.NAME, rows, path, split=split)
            print(f"{path}: {rows} rows, {path.stat().st_size / 2**20:.2f} MiB")


if __name__ == "__main__":
    main()
