"""Fit the working tree into what a lent GPU machine copies (64 MiB: tracked files, untracked files git does not
ignore, carried paths): the zoo models a run needs stay, the others leave git's index and are ignored until
`--restore` puts them back. The files themselves never move.

    python -m mmspec.eval.device_tree --status                         # what would travel now, and the zoo's sizes
    python -m mmspec.eval.device_tree --keep shapes pycode/target pycode/draft --carry .whl
    python -m mmspec.eval.device_tree --restore                        # the index and the ignore list as before

`--keep` names zoo worlds (`shapes`) or their model folders (`shapes/transformer`); every other model folder of the
zoo leaves (a world's own files, such as its model_index.json, stay with any of its models). `--carry` names the
ignored paths the run will carry (wheels), which count too. Nothing changes when what would travel exceeds
`--limit-mib` (default 60, the copy's 64 less a margin): the answer lists the kept folders' sizes to choose from.

While the tree is fitted the index holds the left folders' deletion: `git commit -a` would commit it, so restore
before committing (`--status` says whether the tree is fitted).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ZOO = "mmspec/zoo"
BEGIN, END = "# mmspec.eval.device_tree: begin", "# mmspec.eval.device_tree: end"
MIB = 1 << 20


class TreeError(ValueError):
    """A request this command refuses, before it changes anything."""


def git(*args: str, root: Path | None = None) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def repository_root() -> Path:
    root = Path(git("rev-parse", "--show-toplevel").strip())
    if not (root / ZOO).is_dir():
        raise TreeError(f"{root} is not an mmspec checkout (no {ZOO}/)")
    return root


def travelling_files(root: Path) -> list[str]:
    """What a device run copies: tracked files and untracked files git does not ignore."""
    return git("ls-files", "-z", "--cached", "--others", "--exclude-standard", root=root).split("\0")[:-1]


def size(root: Path, paths) -> int:
    total = 0
    for path in paths:
        path = root / path
        if path.is_file():
            total += path.stat().st_size
        elif path.is_dir():
            total += sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return total


def model_folders(root: Path) -> list[str]:
    """The zoo's model folders, in the index or the last commit (a fitted tree's left folders are in the commit
    only): `mmspec/zoo/<world>/<model>`, or the world itself where its files sit in no model folder (an evaluation
    model such as shapes_clip)."""
    listed = git("ls-files", "-z", ZOO, root=root)
    listed += git("ls-tree", "-r", "-z", "--name-only", "HEAD", "--", ZOO, root=root)
    parts = [path.split("/") for path in set(listed.split("\0")) if path]
    nested = {p[2] for p in parts if len(p) > 4}
    return sorted({"/".join(p[:4]) for p in parts if len(p) > 4}
                  | {"/".join(p[:3]) for p in parts if len(p) == 4 and p[2] not in nested})


def folders_count(n: int) -> str:
    return f"{n} zoo folder{'s' * (n != 1)}"


def exclude_file(root: Path) -> Path:
    return root / git("rev-parse", "--git-path", "info/exclude", root=root).strip()


def fitted(root: Path) -> list[str]:
    """The folders a fitted tree left out (none: not fitted)."""
    path = exclude_file(root)
    lines = path.read_text().splitlines() if path.exists() else []
    if BEGIN not in lines:
        return []
    block = lines[lines.index(BEGIN) + 1 : lines.index(END)]
    return [line.strip("/") for line in block]


def fit(root: Path, keep: list[str], carry: list[str], limit_mib: float) -> None:
    if fitted(root):
        raise TreeError("the tree is fitted already; --restore first")
    folders = model_folders(root)
    kept = [f"{ZOO}/{name.strip('/')}/" for name in keep]
    for name, prefix in zip(keep, kept, strict=True):
        if not any(f"{folder}/".startswith(prefix) for folder in folders):
            worlds = sorted({folder.split("/")[2] for folder in folders})
            raise TreeError(f"--keep: no zoo world or model folder {name!r}; choose from "
                            f"{', '.join(worlds)} or their folders ({', '.join(f[len(ZOO) + 1:] for f in folders)})")
    leave = [folder for folder in folders if not any(f"{folder}/".startswith(k) for k in kept)]
    left = {path for folder in leave for path in git("ls-files", "-z", folder, root=root).split("\0")[:-1]}
    travelling = size(root, [p for p in travelling_files(root) if p not in left]) + size(root, carry)
    if travelling > limit_mib * MIB:
        sizes = ", ".join(f"{f[len(ZOO) + 1:]} {size(root, [f]) / MIB:.1f}" for f in folders if f not in leave)
        raise TreeError(f"{travelling / MIB:.1f} MiB would travel, over --limit-mib {limit_mib:g}; "
                         f"nothing changed. Kept model folders (MiB): {sizes}")
    if leave:
        git("rm", "-r", "-q", "--cached", "--", *leave, root=root)
    path = exclude_file(root)
    before = path.read_text() if path.exists() else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(before + ("" if before.endswith("\n") or not before else "\n")
                    + "\n".join([BEGIN, *(f"/{folder}/" for folder in leave), END]) + "\n")
    print(f"fitted: {travelling / MIB:.1f} MiB would travel ({folders_count(len(leave))} left out); restore before "
          "committing: python -m mmspec.eval.device_tree --restore")


def restore(root: Path) -> None:
    leave = fitted(root)
    if not leave:
        print("the tree is not fitted: nothing to restore")
        return
    git("reset", "-q", "HEAD", "--", *leave, root=root)
    path = exclude_file(root)
    lines = path.read_text().splitlines()
    kept = lines[: lines.index(BEGIN)] + lines[lines.index(END) + 1 :]
    path.write_text("\n".join(kept) + ("\n" if kept else ""))
    print(f"restored {folders_count(len(leave))} to the index")


def status(root: Path) -> None:
    leave = fitted(root)
    print(f"{size(root, travelling_files(root)) / MIB:.1f} MiB would travel now (carried paths not counted); "
          + (f"fitted: {folders_count(len(leave))} left out" if leave else "not fitted"))
    for folder in sorted({*model_folders(root), *leave}):
        print(f"  {size(root, [folder]) / MIB:6.1f} MiB  {folder[len(ZOO) + 1:]}"
              + ("  (left out)" if folder in leave else ""))


def main(argv: list[str] | None = None) -> int | None:
    parser = argparse.ArgumentParser(prog="python -m mmspec.eval.device_tree", description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--keep", nargs="+", metavar="ZOO_PATH", help="zoo worlds or model folders the run needs")
    action.add_argument("--restore", action="store_true", help="put the left folders back into the index")
    action.add_argument("--status", action="store_true", help="what would travel, and each model folder's size")
    parser.add_argument("--carry", nargs="*", default=[], metavar="PATH", help="ignored paths the run carries")
    parser.add_argument("--limit-mib", type=float, default=60.0, help="the most that may travel (default 60)")
    args = parser.parse_args(argv)
    if args.carry and not args.keep:
        parser.error("--carry goes with --keep")
    if not 0 < args.limit_mib <= 64:
        parser.error(f"--limit-mib must be in (0, 64], got {args.limit_mib:g}")
    try:
        root = repository_root()
        if args.restore:
            restore(root)
        elif args.status:
            status(root)
        else:
            fit(root, args.keep, args.carry, args.limit_mib)
    except TreeError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
