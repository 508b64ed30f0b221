"""``setdlm data``: prepared data with a sha256 + row-count manifest.

    setdlm data prepare --dataset gsm8k --source dir --data-dir ../shared/data --out DIR
    setdlm data prepare --dataset cnn_dailymail --source hub --out DIR
    setdlm data manifest DIR      # merge the per-dataset parts into DIR/manifest.json
    setdlm data verify DIR        # every file still matches the manifest

DIR is laid out like ``SETDLM_DATA_DIR`` (see setdlm/workflow/datasets.py); run an evaluation
with ``SETDLM_DATA_DIR=DIR`` and it reads exactly the files the manifest lists.
"""

from __future__ import annotations

import sys
from pathlib import Path

from setdlm.util.errors import ArgumentParser
from setdlm.util.validation import output_path
from setdlm.workflow import datasets


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="setdlm data", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="copy or fetch one dataset")
    prepare.add_argument("--dataset", required=True, choices=sorted(datasets.DATASETS))
    prepare.add_argument("--source", required=True, choices=("dir", "hub"))
    prepare.add_argument(
        "--data-dir", type=Path, default=None, help="for --source dir (default: $SETDLM_DATA_DIR)"
    )
    prepare.add_argument("--out", type=output_path, required=True, help="the prepared data folder")
    manifest = commands.add_parser("manifest", help="merge the datasets' parts into manifest.json")
    manifest.add_argument("folder", type=Path)
    verify = commands.add_parser("verify", help="check the files against manifest.json")
    verify.add_argument("folder", type=Path)
    args = parser.parse_args(argv)

    if args.command == "prepare":
        data_dir = args.data_dir
        if args.source == "dir" and data_dir is None:
            from setdlm.util.paths import data_dir as environment_data_dir

            data_dir = environment_data_dir()
            if data_dir is None:
                parser.error("--source dir needs --data-dir or SETDLM_DATA_DIR")
        datasets.prepare(args.dataset, args.source, args.out, data_dir)
        return 0
    if args.command == "manifest":
        manifest = datasets.write_manifest(args.folder)
        print(f"{args.folder / datasets.MANIFEST}: {len(manifest['files'])} files")
        return 0
    problems = datasets.verify(args.folder)
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"{args.folder}: {'FAILED' if problems else 'every file matches the manifest'}")
    return 1 if problems else 0
