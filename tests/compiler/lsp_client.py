"""A minimal Language Server Protocol client over stdio, for driving the real YAML language
server (tools/editor-clients) the way an editor does: initialize, configure, open, read the
published diagnostics, complete."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from pathlib import Path
from typing import Any, Self

from tests.cli_support import REPO

SERVER = REPO / "tools" / "editor-clients" / "node_modules" / ".bin" / "yaml-language-server"
INSTALL = "sh tools/install-editor-clients.sh"


class LanguageServer:
    """One ``yaml-language-server --stdio`` process; messages read on a thread."""

    def __init__(self, root: Path, settings: dict[str, Any]) -> None:
        if not SERVER.exists():
            raise AssertionError(f"the YAML language server is not installed: run `{INSTALL}`")
        self.settings = settings
        self.process = subprocess.Popen(
            [str(SERVER), "--stdio"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, cwd=root, env={**os.environ, "NODE_NO_WARNINGS": "1"})
        self.inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        self.diagnostics: dict[str, list[dict[str, Any]]] = {}
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()
        self.request("initialize", {
            "processId": os.getpid(), "rootUri": root.as_uri(),
            "capabilities": {"workspace": {"configuration": True},
                             "textDocument": {"completion": {"completionItem": {
                                 "snippetSupport": True, "documentationFormat": ["plaintext"]}}}},
        })
        self.notify("initialized", {})
        self.notify("workspace/didChangeConfiguration", {"settings": settings})

    def close(self) -> None:
        try:
            self.request("shutdown", None)
            self.notify("exit", None)
            self.process.wait(timeout=10)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, message: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        assert self.process.stdin is not None
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.process.stdin.flush()

    def _read(self) -> None:
        stream = self.process.stdout
        assert stream is not None
        while True:
            length = 0
            while (line := stream.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if not line:
                return
            self.inbox.put(json.loads(stream.read(length)))

    def notify(self, method: str, params: Any) -> None:
        self._send({"method": method, "params": params})

    def request(self, method: str, params: Any, timeout: float = 60) -> Any:
        self.next_id += 1
        ident = self.next_id
        self._send({"id": ident, "method": method, "params": params})
        while True:
            message = self._next(timeout)
            if message.get("id") == ident and "method" not in message:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message.get("result")

    def _next(self, timeout: float) -> dict[str, Any]:
        try:
            message = self.inbox.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("the YAML language server did not answer") from None
        method = message.get("method")
        if method == "textDocument/publishDiagnostics":
            self.diagnostics[message["params"]["uri"]] = message["params"]["diagnostics"]
        elif method is not None and "id" in message:  # a request of the server's
            items = message.get("params", {}).get("items", [])
            result = [self.settings.get(i.get("section", ""), None) for i in items] \
                if method == "workspace/configuration" else None
            self._send({"id": message["id"], "result": result})
        return message

    def open(self, path: Path, text: str | None = None) -> str:
        uri = path.as_uri()
        self.diagnostics.pop(uri, None)
        self.notify("textDocument/didOpen", {"textDocument": {
            "uri": uri, "languageId": "yaml", "version": 1,
            "text": path.read_text(encoding="utf-8") if text is None else text}})
        return uri

    def diagnose(self, path: Path, text: str | None = None,
                 timeout: float = 60) -> list[dict[str, Any]]:
        """The diagnostics the server publishes for ``path`` once opened."""
        uri = self.open(path, text)
        while uri not in self.diagnostics:
            self._next(timeout)
        found = self.diagnostics[uri]
        self.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
        return found

    def complete(self, uri: str, line: int, character: int) -> list[dict[str, Any]]:
        result = self.request("textDocument/completion", {
            "textDocument": {"uri": uri}, "position": {"line": line, "character": character}})
        items: list[dict[str, Any]] = (result or {}).get("items", []) \
            if isinstance(result, dict) else (result or [])
        return items
