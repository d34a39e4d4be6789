"""The real etcd test server: it serves the v2 and v3 APIs and leaves no process behind."""

from __future__ import annotations

import base64
import json
import urllib.request
from pathlib import Path
from typing import Any

import etcd
import psutil
import pytest

from tests.conftest import wait_for
from tests.servers import etcd_server


def _post_json(url: str, body: dict[str, str]) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read().decode())


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_etcd_server_serves_v2_and_v3(tmp_path: Path) -> None:
    with etcd_server(tmp_path / "etcd") as server:
        assert server.endpoint == f"127.0.0.1:{server.client_port}"
        client = etcd.Client(host="127.0.0.1", port=server.client_port)
        client.write("/elastic-hydra/test/key", "v2-value")
        assert client.read("/elastic-hydra/test/key").value == "v2-value"

        base = f"http://{server.endpoint}"
        with urllib.request.urlopen(f"{base}/version", timeout=5) as response:
            assert json.loads(response.read().decode())["etcdserver"].startswith("3.")
        # The v3 API through etcd's JSON gateway (its store is separate from v2's).
        _post_json(f"{base}/v3/kv/put", {"key": _b64("v3-key"), "value": _b64("v3-value")})
        found = _post_json(f"{base}/v3/kv/range", {"key": _b64("v3-key")})
        assert base64.b64decode(found["kvs"][0]["value"]) == b"v3-value"


def test_etcd_server_process_is_gone_after_exit(tmp_path: Path) -> None:
    with etcd_server(tmp_path / "first") as server:
        assert psutil.pid_exists(server.pid)
    wait_for(lambda: not psutil.pid_exists(server.pid), 5.0, f"etcd {server.pid} to be gone")

    # Also when the body of the `with` raises.
    with pytest.raises(KeyError), etcd_server(tmp_path / "second") as raising:
        raise KeyError(raising.pid)
    wait_for(lambda: not psutil.pid_exists(raising.pid), 5.0, f"etcd {raising.pid} to be gone")
