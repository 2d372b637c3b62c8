"""One window per data dir: a second launch asks the first to come to the front, then exits."""

from __future__ import annotations

import hashlib
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket


def server_name(data_dir: Path) -> str:
    return "hearth-" + hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:16]


class SingleInstance(QObject):
    activated = Signal()  # another launch asked this one to show itself

    def __init__(self, data_dir: Path, parent: QObject | None = None):
        super().__init__(parent)
        self.name = server_name(data_dir)
        self.server: QLocalServer | None = None

    def already_running(self, timeout_ms: int = 500) -> bool:
        """True (after asking the running one to raise its window) if another instance owns the data dir."""
        socket = QLocalSocket()
        socket.connectToServer(self.name)
        if socket.waitForConnected(timeout_ms):
            socket.write(b"raise\n")
            socket.waitForBytesWritten(timeout_ms)
            socket.disconnectFromServer()
            return True
        return False

    def listen(self) -> bool:
        self.server = QLocalServer(self)
        QLocalServer.removeServer(self.name)  # a socket file left by a crash
        if not self.server.listen(self.name):
            return False
        self.server.newConnection.connect(self._on_connection)
        return True

    def _on_connection(self) -> None:
        while self.server is not None and self.server.hasPendingConnections():
            conn = self.server.nextPendingConnection()
            # The other side writes one short line at once; waiting for it here (at most 200 ms, only
            # when a second copy starts) keeps the socket's lifetime simple.
            if conn.bytesAvailable() or conn.waitForReadyRead(200):
                if bytes(conn.readAll()).startswith(b"raise"):
                    self.activated.emit()
            conn.disconnectFromServer()
            conn.deleteLater()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
