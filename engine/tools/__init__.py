"""Tools from Model Context Protocol servers (issue 33): the servers a person configured (``config.py``), the
running servers and their calls (``host.py``, on the official ``mcp`` SDK), a call's result as the text the
model reads (``results.py``), and the tool loop of a chat turn (``loop.py``). Front ends reach them through
engine/api.py."""
