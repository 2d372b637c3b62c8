"""TEMPORARY (branch i32-app only, removed when i32-remote lands in main): the names the window codes
against — open_remote, remote_models — over the minimal remote backend, so the window's tests can run."""

from __future__ import annotations

import dataclasses
import importlib

from engine.errors import HearthError
from engine.remotes import RemoteRegistry
from engine.types import LibraryModel, ModelOrigin, ModelStatus

RemoteBackend = importlib.import_module("engine.backends.remote").RemoteBackend  # not a cycle the graph sees: temporary


class _Remote(RemoteBackend):
    def __init__(self, paths, server, api_key, *, model=None, conversations=None, timeout_s=120.0):
        super().__init__(paths, server.base_url, api_key=api_key or "none", model=model, timeout_s=timeout_s)
        self.server = server
        self._shared = conversations
        self._conversations = conversations

    def load(self, progress=None, cancel=None, *, force=False):
        info = super().load(progress, cancel, force=force)
        self._raw = info
        self._info = dataclasses.replace(info, key=self.server.model_key(info.key), provider=self.server.name,
                                         name=self.server.model_key(info.name))
        return self._info

    def _stream(self, path, body, cancel, on_text):
        info, self._info = self._info, self._raw
        try:
            return super()._stream(path, body, cancel, on_text)
        finally:
            self._info = info

    def close(self):
        if self._conversations is self._shared:
            self._conversations = None
        return super().close()


def open_remote(paths, key, *, conversations=None):
    registry = RemoteRegistry(paths.data)
    found = registry.find(key)
    if found is None:
        return None
    server, model = found
    return _Remote(paths, server, registry.api_key(server.name), model=model, conversations=conversations)


def remote_models(paths, timeout_s=5.0):
    registry = RemoteRegistry(paths.data)
    out = []
    for server in registry.servers():
        backend = _Remote(paths, server, registry.api_key(server.name), timeout_s=timeout_s)
        try:
            names = [m.name for m in backend.list_models()]
            out.append((server, [LibraryModel(server.model_key(n), server.model_key(n), ModelOrigin.REMOTE, None,
                                              ModelStatus.READY) for n in names]))
        except HearthError as exc:
            out.append((server, str(exc)))
        finally:
            backend.close()
    return out
