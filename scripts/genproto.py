"""Regenerates tfcluster/api/v1 from protos/ (the single source of truth for the wire API).

protoc names generated imports after the proto path (`tfcluster.v1`); the modules live in
`tfcluster.api.v1`, so imports are rewritten. tests/unit/test_api_generated.py runs `generate` into a
temporary folder and fails on any difference from the committed files.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
API_DIR = ROOT / "tfcluster" / "api" / "v1"
HEADER = "# Generated from protos/ by scripts/genproto.py. Do not edit.\n"


def generate(out_dir: Path) -> list[Path]:
    """Writes the generated modules into out_dir and returns their paths."""
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    with tempfile.TemporaryDirectory() as raw:
        args = ["protoc", f"-I{PROTO_ROOT}", f"--python_out={raw}", f"--pyi_out={raw}",
                f"--grpc_python_out={raw}", *protos]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for src in sorted((Path(raw) / "tfcluster" / "v1").iterdir()):
            text = src.read_text()
            text = re.sub(r"\bfrom tfcluster\.v1 import\b", "from tfcluster.api.v1 import", text)
            text = re.sub(r"\bimport tfcluster\.v1\.", "import tfcluster.api.v1.", text)
            dest = out_dir / src.name
            dest.write_text(HEADER + text)
            written.append(dest)
    (out_dir / "__init__.py").write_text(HEADER.replace("Do not edit.", "Package marker."))
    return written


if __name__ == "__main__":
    # Optional argument: another output folder (the freshness test compares one with the committed files).
    out = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else API_DIR
    for path in generate(out):
        print(path, file=sys.stderr)
