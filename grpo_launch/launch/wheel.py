"""A wheel of the grpo-launch that runs this: what a Job installs at its start (scheduler=hf-jobs), so the node
supervisor reading plan.json there is the code that wrote it. Pure Python, one wheel for every platform.

    python -m grpo_launch.launch.wheel OUT_DIR     # prints the wheel's path
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "grpo-launch"
SKIPPED = ("__pycache__",)


def _record(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _package_files() -> list[tuple[str, Path]]:
    """(name in the wheel, file): the package, and the shipped recipes under grpo_launch/recipes as the project's
    own build puts them (a source checkout keeps them beside the package)."""
    package = Path(__file__).resolve().parents[1]
    recipes = package / "recipes" if (package / "recipes").is_dir() else package.parent / "recipes"
    files = [(f"grpo_launch/{p.relative_to(package).as_posix()}", p) for p in sorted(package.rglob("*"))
             if p.is_file() and p.suffix != ".pyc" and not set(p.parts) & set(SKIPPED)]
    if recipes.is_dir() and recipes.parent != package:
        files += [(f"grpo_launch/recipes/{p.relative_to(recipes).as_posix()}", p) for p in sorted(recipes.rglob("*"))
                  if p.is_file()]
    return files


def build_wheel(out_dir: Path) -> Path:
    dist = metadata.distribution(DISTRIBUTION)
    version = dist.version
    info = f"grpo_launch-{version}.dist-info"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"grpo_launch-{version}-py3-none-any.whl"
    partial = path.with_suffix(".partial")
    records = []
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as wheel:
        def add(name: str, data: bytes) -> None:
            wheel.writestr(name, data)
            records.append(_record(name, data))

        for name, file in _package_files():
            add(name, file.read_bytes())
        add(f"{info}/METADATA", (dist.read_text("METADATA") or "").encode())
        add(f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: grpo-launch\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        entry_points = dist.read_text("entry_points.txt")
        if entry_points:
            add(f"{info}/entry_points.txt", entry_points.encode())
        wheel.writestr(f"{info}/RECORD", "\n".join([*records, f"{info}/RECORD,,"]) + "\n")
    partial.replace(path)
    return path


if __name__ == "__main__":
    print(build_wheel(Path(sys.argv[1])))
