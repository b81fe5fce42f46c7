"""Regenerate the Python protobuf and gRPC modules from the .proto files here.

Run as ``python -m app.proto.generate`` (``make proto``). protoc writes imports
relative to the proto root (``from xmtp.backend.v1 import ...``); they are
rewritten to absolute package imports so the generated code needs no
``sys.path`` changes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
_IMPORT = re.compile(r"^from (xmtp|notifications)(\.[\w.]+)? import", re.MULTILINE)
_GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files(root: Path = PROTO_ROOT) -> list[Path]:
    return sorted(root.rglob("*.proto"))


def generate(out_dir: Path = PROTO_ROOT) -> list[Path]:
    """Generate modules for every .proto under PROTO_ROOT into out_dir."""
    from grpc_tools import protoc

    sources = [str(p.relative_to(PROTO_ROOT)) for p in proto_files()]
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{_well_known_include()}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed")
    written = generated_files(out_dir)
    for path in written:
        path.write_text(_rewrite_imports(path.read_text()))
    _ensure_packages(out_dir)
    return written


def generated_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py*") if p.name.endswith(_GENERATED_SUFFIXES))


def _rewrite_imports(source: str) -> str:
    return _IMPORT.sub(lambda m: f"from app.proto.{m.group(1)}{m.group(2) or ''} import", source)


def _ensure_packages(out_dir: Path) -> None:
    for path in generated_files(out_dir):
        for parent in path.relative_to(out_dir).parents:
            init = out_dir / parent / "__init__.py"
            if parent != Path(".") and not init.exists():
                init.write_text("")


def _well_known_include() -> str:
    import grpc_tools

    return str(Path(grpc_tools.__file__).parent / "_proto")


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_ROOT
    for generated in generate(out):
        print(generated)
