"""Render the HTTP API's OpenAPI document as deterministic JSON.

Run as ``python -m app.api.openapi_export`` (``make openapi``) to rewrite the
committed ``openapi/openapi.json``; tests/test_openapi.py checks it is current.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from app.api.main import create_app

OPENAPI_PATH = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"


def render_openapi() -> str:
    """The document `GET /openapi.json` serves: sorted keys, two-space indent, trailing newline."""
    document = create_app().openapi()
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_openapi(path: Path = OPENAPI_PATH) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_openapi(), encoding="utf-8")
    return path


if __name__ == "__main__":
    target = write_openapi(Path(sys.argv[1]) if len(sys.argv) > 1 else OPENAPI_PATH)
    print(target)
