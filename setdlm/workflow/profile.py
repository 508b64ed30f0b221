"""``setdlm profile``: install the Snakemake profiles where ``--profile NAME`` finds them.

    setdlm profile install slurm            # -> ~/.config/snakemake/slurm (or $XDG_CONFIG_HOME)
    setdlm profile install slurm --dest DIR # -> DIR/slurm
    setdlm profile where                    # the folder `snakemake --profile NAME` searches

Snakemake resolves ``--profile slurm`` against the current folder and the user's and site's
Snakemake config folders only (not ``workflows/profiles/``), so ``snakemake --profile slurm
all_tables`` works once the profile is installed. Edit the installed copy's partition, account
and GPU model; reinstalling refuses to overwrite it unless ``--force``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from setdlm.util.errors import ArgumentParser
from setdlm.util.validation import output_path
from setdlm.workflow.config import WORKFLOW_DIR

PROFILES_DIR = WORKFLOW_DIR / "profiles"


def user_config_dir() -> Path:
    """The folder Snakemake searches for named profiles (the same platformdirs call)."""
    from platformdirs import AppDirs

    return Path(AppDirs("snakemake", "snakemake").user_config_dir)


def available() -> list[str]:
    return sorted(p.name for p in PROFILES_DIR.iterdir() if (p / "config.yaml").is_file())


def install(name: str, dest: Path | None = None, force: bool = False) -> Path:
    source = PROFILES_DIR / name
    target = (dest or user_config_dir()) / name
    if target.exists() and not force:
        raise FileExistsError(f"{target} exists (your edits?); pass --force to overwrite it")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, target, dirs_exist_ok=True)
    return target


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="setdlm profile", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    install_parser = commands.add_parser("install", help="copy a profile into a config folder")
    install_parser.add_argument("name", choices=available())
    install_parser.add_argument(
        "--dest", type=output_path, default=None, help="default: the user's Snakemake config folder"
    )
    install_parser.add_argument("--force", action="store_true", help="overwrite an installed copy")
    commands.add_parser("where", help="print the user's Snakemake config folder")
    args = parser.parse_args(argv)

    if args.command == "where":
        print(user_config_dir())
        return 0
    try:
        target = install(args.name, args.dest, args.force)
    except FileExistsError as error:
        print(f"setdlm profile: {error}", file=sys.stderr)
        return 1
    print(f"installed {target}; from the repository: snakemake --profile {args.name} all_tables")
    return 0
